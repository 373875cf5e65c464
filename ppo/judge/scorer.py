"""The ``judge`` scorer: a language model scores each answer by the probability of a verdict token.

Configured by options (a scorer mapping in an argument file or on the reward server)::

    python ppo/reward_server.py --scorer '{"judge": {"model": "outputs/tiny/judge", "template": "tiny"}}'

``model`` (required) is a model directory or LoRA adapter; the other options are those of
``ppo.judge.GenerativeJudge``. The judge's question is the item's ``src``, its answer the
``response`` and its reference the ``tgt`` (used when the template holds ``{reference}``).
Items are scored in batches through the rollout engine's prefill (``score_batch``); a built
judge is kept per process and options, so a scorer built twice loads its model once. Importing
this module imports no Paddle: the model loads when the scorer is built.
"""
import os
import threading

from ..common.registry_settings import Setting, options_of
from ..scoring.registry import ScorerFacts, register_scorer
from .templates import VERDICTS

SETTINGS = (
    Setting("model", str, None, "The judge: a model directory or LoRA adapter (required)."),
    Setting("template", str, "correct", "The pointwise rubric: a template name or a text with {question} and {answer}."),
    Setting("pair_template", str, "better", "The pairwise rubric: a template name or a text with {question}, "
            "{answer_a} and {answer_b}."),
    Setting("verdict", str, "yes_no", "yes_no: P(yes) / (P(yes) + P(no)); score: the expected score over the score "
            "tokens, scaled to [0, 1].", choices=VERDICTS),
    Setting("yes", str, "Yes", "The verdict word of a correct answer (its first token is read)."),
    Setting("no", str, "No", "The verdict word of a wrong answer."),
    Setting("scores", (str, list), "1,2,3,4,5,6,7,8,9,10", "verdict score: the score words, lowest first (one token each)."),
    Setting("pair_words", (str, list), "A,B", "The words naming the first and the second answer of a pair."),
    Setting("batch_size", int, 64, "Items per judge forward.", bounds=(1, True, None, False)),
    Setting("max_prompt_len", int, 0, "Most tokens of a judge prompt (longer ones are cut from the left); 0: no cap.",
            bounds=(0, True, None, False)),
    Setting("use_rollout_engine", bool, True, "Score through the rollout engine's prefill (false: the model's forward)."),
)
OPTIONS = options_of(SETTINGS)
"""name -> default of the judge's options (its `SETTINGS`)."""
RUBRICS = {"template": False, "pair_template": True}
"""The rubric options and whether each is pairwise (`rubric_problem` checks them)."""
_JUDGES = {}
_LOCK = threading.Lock()


def _words(value):
    return tuple(w for w in (value.split(",") if isinstance(value, str) else value))


def build_judge(**options):
    """The `GenerativeJudge` of `options` (see `OPTIONS`), built once per process and options."""
    if not options.get("model"):
        raise ValueError("the judge scorer needs the option model (a model directory or LoRA adapter), e.g. "
                         "--scorer '{\"judge\": {\"model\": \"outputs/tiny/judge\"}}'")
    key = tuple(sorted((k, str(v)) for k, v in options.items()))
    with _LOCK:
        judge = _JUDGES.get(key)
        if judge is None:
            from .model_judge import GenerativeJudge

            settings = {k: v for k, v in options.items() if k != "model"}
            settings["scores"], settings["pair_words"] = _words(settings["scores"]), _words(settings["pair_words"])
            judge = _JUDGES[key] = GenerativeJudge.from_pretrained(options["model"], **settings)
    return judge


def rubric_problem(value, pairwise):
    """Why `value` is no rubric of its mode (a built-in template name, or a text with the fields the
    mode needs), or None: the check of the options `RUBRICS` names (and of online DPO's `judge_*`
    rubrics, declared from them)."""
    from .templates import check_template, template_text

    try:
        check_template(template_text(str(value)), pairwise)
    except ValueError as err:
        return str(err)
    return None


def judge_option_problems(**options):
    """What `build_judge` would fail on, found without loading a model: no `model`, a `model` that
    is no model directory here (PaddleNLP would take a missing path for a model-hub name and try to
    download it), a template unknown (each option's type and values are its declaration's)."""
    from ..common.validation import check_model_dir

    model, problems = options.get("model"), []
    if not model:
        problems.append("the judge scorer needs the option model (a model directory or LoRA adapter)")
    elif not os.path.isdir(os.path.expanduser(str(model))):
        problems.append(f"option model={model}: no such directory (the judge loads a local model directory or LoRA "
                        "adapter)")
    else:
        try:
            check_model_dir("option model", os.path.expanduser(str(model)))
        except ValueError as err:
            problems.append(str(err))
    for name, pairwise in RUBRICS.items():
        problem = rubric_problem(options.get(name), pairwise)
        if problem:
            problems.append(f"option {name}: {problem}")
    return problems


def judge_scorer(**options):
    """A scorer `(src, tgt, response) -> float` with `score_batch(src, tgt, response)` (one prefill
    per batch) and `judge` (the `GenerativeJudge`, whose `compare` is the pairwise mode)."""
    judge = build_judge(**{**OPTIONS, **options})

    def score(src, tgt, response):
        return judge.score([src], [response], [tgt])[0]

    score.score_batch = lambda src, tgt, response: judge.score(list(src), list(response), list(tgt))
    score.judge = judge
    return score


def unconfigured_judge(src, tgt, response):
    """`judge` named without options: no model to ask, so no score can be computed."""
    return build_judge(**OPTIONS)(src, tgt, response)


register_scorer("judge", unconfigured_judge, ScorerFacts(
    summary="a language model's verdict: P(Yes)/(P(Yes)+P(No)) after a rubric prompt, or the expected score over "
            "score tokens, scaled to [0, 1]",
    values="[0, 1]", label="a reference answer when the template holds {reference}; otherwise unused",
    lowest_when="the judge model is sure the answer is wrong",
    raises_when="no model option; verdict words that start with the same token; a template that needs a reference "
                "and an empty label",
    correct_at=0.5, settings=SETTINGS, build=judge_scorer, check=judge_option_problems,
))
