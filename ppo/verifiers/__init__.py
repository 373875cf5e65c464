"""The built-in scorers: rule rewards and verifiers, one module each, registered on the scorer
registry (``ppo/scoring/registry.py``) with their facts when this package is imported.

- ``basic``: ``math`` (last number), ``reverse`` (the demo task);
- ``kk``: Knights and Knaves (PaddleNLP's reward server);
- ``gsm8k``: ``gsm8k`` and ``gsm8k_flexible`` (PaddleNLP's GSM8K rule);
- ``math_boxed``: the last ``\\boxed{}``, LaTeX normal forms, exact numbers, sympy;
- ``format_tags``: ``format``, think/answer tags;
- ``code``: the response's program against the label's tests in ``ppo/sandbox/``;
- ``choice``: a multiple-choice letter;
- ``penalties``: ``length`` and ``repetition``.

The model judge's entry (``judge``) needs a model and the rollout engine, so it lives above
this package, in ``ppo/judge/scorer.py``; ``ppo.scorers`` registers it with these.

:func:`verifier_table` renders the registry as the Markdown table of docs/verifiers.md.
"""
from . import basic, choice, code, format_tags, gsm8k, kk, math_boxed, penalties  # noqa: F401 (registration)


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def verifier_table():
    """The Markdown table of every registered scorer with facts: name, values, label, correct
    at, lowest when, raises when, options (with defaults)."""
    from ..scoring.registry import list_scorers, scorer_facts

    rows = ["| name | what it checks | values | label (`tgt`) | correct at | lowest value when (a legitimate score) "
            "| raises when (no reward can be computed) | options (defaults) |",
            "|---|---|---|---|---|---|---|---|"]
    for name in list_scorers():
        facts = scorer_facts(name)
        if facts is None:
            continue
        options = ", ".join(f"`{k}={v!r}`" for k, v in facts.options.items()) or "-"
        correct = "-" if facts.correct_at is None else f"{facts.correct_at:g}"
        rows.append("| " + " | ".join(_cell(c) for c in (
            f"`{name}`", facts.summary, facts.values, facts.label, correct, facts.lowest_when or "-",
            facts.raises_when, options)) + " |")
    return "\n".join(rows)
