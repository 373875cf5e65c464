"""Rubric prompts of the generative judge and the verdict tokens it reads.

A template is plain text with fields replaced literally (braces inside a question or an answer
are safe): ``{question}``, ``{answer}`` and, when the template asks for one, ``{reference}`` (the
label of the item, e.g. the dataset's reference answer); pairwise templates take ``{answer_a}``
and ``{answer_b}``. A template is given by name (``TEMPLATES``) or as its text.

The verdict is the token that comes right after the prompt: the FIRST token of each verdict
word as the tokenizer encodes it without special tokens (write ``" Yes"`` with its space when
the model writes one there). Two verdicts that start with the same token cannot be told apart
and are refused, as are score words that are more than one token (``"10"`` is two tokens for a
character-level tokenizer: use ``"1,...,9"`` there).
"""
TEMPLATES = {
    "correct": ("Question: {question}\nAnswer: {answer}\n\nIs the answer correct and complete? Reply with Yes or No."
                "\nVerdict:"),
    "correct_with_reference": ("Question: {question}\nReference answer: {reference}\nAnswer: {answer}\n\nDoes the "
                               "answer agree with the reference answer? Reply with Yes or No.\nVerdict:"),
    "score": ("Question: {question}\nAnswer: {answer}\n\nRate the answer from 1 (useless) to 10 (perfect). Reply with "
              "the number only.\nScore:"),
    "better": ("Question: {question}\n\nAnswer A: {answer_a}\n\nAnswer B: {answer_b}\n\nWhich answer is better? Reply "
               "with A or B.\nBetter answer:"),
    "tiny": "USER: {question} ASSISTANT:{answer} Judge:",
    "tiny_better": "USER: {question} ASSISTANT:{answer_a} USER: {question} ASSISTANT:{answer_b} Better:",
    "tiny_reference": "USER: {question} REF:{reference} ASSISTANT:{answer} Judge:",
}
"""Built-in templates by name: `correct` (yes/no), `correct_with_reference`, `score` (1-10),
`better` (pairwise A/B), and the demo task's `tiny` / `tiny_better`: the answer stands where the
tiny policy writes its own (right after `ASSISTANT:`), then a verdict cue; `tiny_better` shows the
question twice, one answer after each (`A` = the first); `tiny_reference` puts the reference answer
right before the answer, so that answer character k stands a fixed distance after reference character k (the
reference's length plus 11 characters; plus 2 tokens for the demo's tokenizer): a copy at one relative offset instead of a mirror.
`ppo/tiny/judge_data.py` teaches a tiny policy to answer them."""

FIELDS = ("question", "answer", "reference", "answer_a", "answer_b")
VERDICTS = ("yes_no", "score")
"""The verdict kinds of `model_judge.GenerativeJudge`: yes/no words, or score words valued 1, 2, ..."""


def template_text(template):
    """The text of `template` (a name of `TEMPLATES`, or the text itself when it holds a field)."""
    if template in TEMPLATES:
        return TEMPLATES[template]
    if any("{" + f + "}" in template for f in FIELDS):
        return template
    raise ValueError(f"judge template {template!r} is neither a built-in name ({', '.join(TEMPLATES)}) nor a text "
                     "with {question} and {answer} (or {answer_a} and {answer_b})")


def check_template(text, pairwise):
    """Raise ValueError when `text` lacks the fields its mode needs."""
    need = ("{question}", "{answer_a}", "{answer_b}") if pairwise else ("{question}", "{answer}")
    missing = [f for f in need if f not in text]
    if missing:
        kind = "pairwise" if pairwise else "pointwise"
        raise ValueError(f"the {kind} judge template lacks {', '.join(missing)}: {text!r}")


def render(text, **values):
    """`text` with each `{field}` replaced literally by its value; a `{reference}` without a
    reference (None or blank) raises ValueError (no score can be computed without it)."""
    if "{reference}" in text and not (values.get("reference") or "").strip():
        raise ValueError("the judge template uses {reference} but the item has no reference answer (empty label)")
    out = text
    for name in FIELDS:
        if "{" + name + "}" in out:
            out = out.replace("{" + name + "}", "" if values.get(name) is None else str(values[name]))
    return out


def first_token_ids(tokenizer, words):
    """The first token id of each word (tokenised without special tokens); ValueError when a word
    gives no token or two words start with the same token."""
    ids = []
    for word in words:
        tokens = tokenizer(word, add_special_tokens=False)["input_ids"]
        if not tokens:
            raise ValueError(f"the verdict {word!r} gives no token")
        ids.append(int(tokens[0]))
    if len(set(ids)) != len(ids):
        raise ValueError(f"verdicts {list(words)} start with the same token ({ids}): the judge cannot tell them apart; "
                         "choose words whose first tokens differ")
    return ids


def single_token_ids(tokenizer, words):
    """The token id of each score word; ValueError naming the words that are not one token."""
    encoded = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]
    long = [w for w, t in zip(words, encoded) if len(t) != 1]
    if long:
        raise ValueError(f"score words {long} are not single tokens for this tokenizer; choose words that are (e.g. "
                         "1,...,9 for a character-level tokenizer)")
    ids = [int(t[0]) for t in encoded]
    if len(set(ids)) != len(ids):
        raise ValueError(f"score words {list(words)} share tokens ({ids})")
    return ids
