"""``math_boxed``: the last ``\\boxed{}`` of the response against the label, up to LaTeX form and
symbolic equivalence (the MATH / DeepScaleR convention; verl's ``reward_score/math.py`` and
``math_dapo.py``, Hendrycks et al. 2021's grader, rewritten here).

The answer is equal to the label when, in order:

1. their normal forms are equal (``ppo.verifiers.latex.normalize``: ``\\dfrac``, ``\\left``/
   ``\\right``, ``\\!``, units such as ``\\text{cm}``, degrees, percent, thousands separators,
   ``x =`` ...);
2. both are plain numbers with the same exact value (``0.5``, ``.5``, ``\\frac{1}{2}``, ``1/2``,
   ``5e-1``, ``5\\times10^{-1}`` are all one half: compared as fractions, never as floats);
3. both are lists (top-level commas, e.g. ``(1, 2)``) of the same length whose items are equal
   by these rules, in order;
4. sympy finds them equivalent (``ppo.verifiers.symbolic``): both must rewrite into sympy's
   syntax from a whitelist, and the check runs in a child process with a CPU-time, wall-clock
   and memory limit.

Scores: 1.0 when equal, else 0.0. A response without ``\\boxed{}`` (or with unclosed braces in the
last one) is an unreadable answer: 0.0. A symbolic check that runs out of its limits is an answer
that could not be shown right: 0.0, with a warning naming both strings (sympy evaluates
``9^{9^{9}}`` exactly, and the model wrote it). The label is the answer itself (``\\frac{1}{2}``)
or a solution whose last ``\\boxed{}`` holds it; an empty label or a boxed label with unclosed
braces raises: the reward cannot be computed.
"""
import logging
from typing import Optional

from ..common.registry_settings import Setting
from ..scoring.registry import ScorerFacts, register_scorer
from .latex import last_boxed, normalize, number
from .symbolic import SymbolicTimeout, equivalent, to_sympy_syntax

logger = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 5.0
_OPEN, _CLOSE = "({[", ")}]"


def reference_answer(tgt: str) -> str:
    """The label's answer: its last ``\\boxed{}`` when it has one, else the label; ValueError when empty."""
    answer = last_boxed(tgt) if ("\\boxed" in tgt or "\\fbox" in tgt) else tgt
    if answer is None:
        raise ValueError(f"math_boxed label has a \\boxed{{}} whose braces do not close: {tgt[:200]!r}")
    if not normalize(answer):
        raise ValueError(f"math_boxed label is empty: {tgt[:200]!r}")
    return answer


def split_top_level(s: str):
    """``(1,2)`` -> ``["1", "2"]``; ``\\frac{1,2}{3}`` stays whole. Outer parentheses or brackets
    of a list are dropped."""
    if len(s) > 1 and s[0] in "([" and s[-1] in ")]":
        inner = s[1:-1]
        if _depth_ok(inner):
            s = inner
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        depth += (c in _OPEN) - (c in _CLOSE)
        if c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    return parts + [s[start:]]


def _depth_ok(s):
    depth = 0
    for c in s:
        depth += (c in _OPEN) - (c in _CLOSE)
        if depth < 0:
            return False
    return depth == 0


def _symbolic_match(g, e, timeout_s, memory_mb):
    a, b = to_sympy_syntax(g), to_sympy_syntax(e)
    if a is None or b is None:
        return False
    try:
        return bool(equivalent(a, b, cpu_s=max(1, round(timeout_s)), wall_s=2 * timeout_s + 2, memory_mb=memory_mb))
    except SymbolicTimeout as err:
        logger.warning("math_boxed: %s comparing %r with the label %r; scored as not equal", err, g[:200], e[:200])
        return False


def forms_match(g: str, e: str, symbolic=True, timeout_s=DEFAULT_TIMEOUT_S, memory_mb=2048) -> bool:
    """Whether two normal forms are the same answer (rules 1-4 of the module docstring)."""
    if g == e:
        return True
    if not g:
        return False
    x, y = number(g), number(e)
    if x is not None and y is not None:
        return x == y
    gs, es = split_top_level(g), split_top_level(e)
    if len(gs) != len(es):
        return False
    if len(gs) > 1:
        return all(forms_match(a, b, symbolic, timeout_s, memory_mb) for a, b in zip(gs, es))
    return symbolic and _symbolic_match(g, e, timeout_s, memory_mb)


def boxed_answer(src: str, response: str) -> Optional[str]:
    """The normal form of the response's last ``\\boxed{}`` (None without one), for votes."""
    given = last_boxed(response)
    return None if given is None else normalize(given)


SETTINGS = (
    Setting("symbolic", bool, True, "Rule 4: an answer sympy proves equal to the label counts (false: skip it)."),
    Setting("timeout_s", float, DEFAULT_TIMEOUT_S, "CPU seconds of one symbolic check (its wall-clock limit is "
            "twice that plus 2 s).", bounds=(0.0, False, None, False)),
    Setting("memory_mb", int, 2048, "Memory (MB) of the symbolic check's worker process.", bounds=(256, True, None, False)),
)


def make_math_boxed(symbolic=True, timeout_s=DEFAULT_TIMEOUT_S, memory_mb=2048):
    """The ``math_boxed`` scorer; `symbolic` False skips rule 4, `timeout_s` is the CPU time of
    one symbolic check (its wall-clock limit is twice that plus 2 s), `memory_mb` its memory."""

    def math_boxed_score(src: str, tgt: str, response: str) -> float:
        expected = normalize(reference_answer(tgt))
        given = boxed_answer(src, response)
        if given is None:
            return 0.0
        return 1.0 if forms_match(given, expected, symbolic, timeout_s, int(memory_mb)) else 0.0

    math_boxed_score.extract_answer = boxed_answer
    return math_boxed_score


math_boxed_score = make_math_boxed()
register_scorer("math_boxed", math_boxed_score, ScorerFacts(
    summary="last \\boxed{} equals the label after LaTeX normalisation, as exact numbers, or by sympy",
    values="{0, 1}", label="the answer (LaTeX), or a solution whose last \\boxed{} holds it",
    lowest_when="no \\boxed{} or unclosed braces; a different answer; a symbolic check past its limits (warned)",
    raises_when="the label is empty or its \\boxed{} does not close", correct_at=1.0,
    settings=SETTINGS, build=make_math_boxed,
))
