"""``choice``: the letter of a multiple-choice answer equals the label's (MMLU, GPQA, ARC style).

The response's letter is the first of, searched from the end of the text:

1. the last ``\\boxed{X}`` (``\\boxed{(B)}``, ``\\boxed{\\text{B}}`` too);
2. the last "answer is X" / "answer: X" / "Answer - (X)" ("answer" in any case, X a capital,
   with ``**``, ``(``, ``)`` or ``.`` around X allowed);
3. the whole response being one letter, alone or as ``(B)``, ``B.``, ``B)``, ``[B]``.

A letter outside ``choices`` (default A-J), or a response where none of these is found, is an
unreadable answer: 0.0. A bare "A" inside a sentence ("A cat ...") is never taken for a choice.
The label is one of the letters, possibly written ``(B)``, ``B.`` or ``Answer: B``; a label that
is not raises: the reward cannot be computed. Letters compare case-insensitively.
"""
import re
from typing import Optional

from ..common.registry_settings import Setting
from ..scoring.registry import ScorerFacts, register_scorer
from .latex import last_boxed

_ANSWER_IS_RE = re.compile(r"(?i:answer)(?:\s+(?i:is)|\s*[:\-])\s*(?:\*\*)?\s*[\(\[]?\s*([A-Z])\s*[\)\]]?(?:\*\*)?(?![A-Za-z])")
_ALONE_RE = re.compile(r"[\(\[]?\s*([A-Za-z])\s*[\)\]\.:]?")
_BOX_RE = re.compile(r"(?:\\text\{)?\s*\(?\s*([A-Za-z])\s*\)?\s*\}?")


def _letter_of(text: str) -> Optional[str]:
    stripped = text.strip().rstrip(".").strip()
    boxed = last_boxed(stripped)
    if boxed is not None:
        m = _BOX_RE.fullmatch(boxed.strip())
        return m.group(1).upper() if m else None
    found = _ANSWER_IS_RE.findall(stripped)
    if found:
        return found[-1].upper()
    m = _ALONE_RE.fullmatch(stripped)
    return m.group(1).upper() if m else None


def _letters_problem(choices):
    letters = str(choices).upper()
    if not letters or not letters.isalpha() or len(set(letters)) != len(letters):
        return "must be distinct letters, e.g. 'ABCD'"
    return None


SETTINGS = (Setting("choices", str, "ABCDEFGHIJ", "The letters an answer may be (distinct letters).",
                    check=_letters_problem),)


def make_choice(choices="ABCDEFGHIJ"):
    """The ``choice`` scorer over the letters of `choices`."""
    letters = str(choices).upper()

    def choice_answer(src: str, response: str) -> Optional[str]:
        letter = _letter_of(response)
        return letter if letter is not None and letter in letters else None

    def choice_score(src: str, tgt: str, response: str) -> float:
        expected = _letter_of(tgt)
        if expected is None or expected not in letters:
            raise ValueError(f"choice label is not one of the letters {letters}: {tgt[:200]!r}")
        return 1.0 if choice_answer(src, response) == expected else 0.0

    choice_score.extract_answer = choice_answer
    return choice_score


choice_score = make_choice()
register_scorer("choice", choice_score, ScorerFacts(
    summary="multiple choice: the letter in \\boxed{}, after 'answer is', or alone equals the label's letter",
    values="{0, 1}", label="a letter: 'B', '(B)', 'Answer: B'",
    lowest_when="another letter, a letter outside the choices, or no letter found",
    raises_when="the label is not one of the letters", correct_at=1.0,
    settings=SETTINGS, build=make_choice,
))
