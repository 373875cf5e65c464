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

:func:`verifier_table` renders the registry as the Markdown table of docs/verifiers.md, and
:func:`scorer_settings_table` one row per declared setting (option) of each scorer.
"""
from . import basic, choice, code, format_tags, gsm8k, kk, math_boxed, penalties  # noqa: F401 (registration)


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _own_scorers():
    """`(name, facts)` of the scorers with facts that this package registers, by name (a
    `module:attr` entry, even of a function of this package, is a run's reference, not a row)."""
    from ..scoring.registry import get_scorer, list_scorers, scorer_facts

    return [(n, scorer_facts(n)) for n in list_scorers()
            if ":" not in n and scorer_facts(n) is not None and getattr(get_scorer(n), "__module__", "").startswith("ppo.")]


def verifier_table():
    """The Markdown table of every scorer with facts this package registers: name, values, label,
    correct at, lowest when, raises when, options (with defaults)."""

    rows = ["| name | what it checks | values | label (`tgt`) | correct at | lowest value when (a legitimate score) "
            "| raises when (no reward can be computed) | options (defaults) |",
            "|---|---|---|---|---|---|---|---|"]
    for name, facts in _own_scorers():
        options = ", ".join(f"`{k}={v!r}`" for k, v in facts.options.items()) or "-"
        correct = "-" if facts.correct_at is None else f"{facts.correct_at:g}"
        rows.append("| " + " | ".join(_cell(c) for c in (
            f"`{name}`", facts.summary, facts.values, facts.label, correct, facts.lowest_when or "-",
            facts.raises_when, options)) + " |")
    return "\n".join(rows)


def scorer_settings_table():
    """The Markdown rows of every declared setting of every scorer this package registers (name,
    type, default, values, help), generated from their `ppo.algos.Setting` declarations."""
    from ..common.registry_settings import settings_rows

    return settings_rows([(n, facts.settings) for n, facts in _own_scorers()], "scorer")
