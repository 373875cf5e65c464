"""The first rule scorers: ``math`` (last number, compared as floats) and ``reverse`` (the demo task)."""
import math
import re
from typing import Optional

from ..scoring.registry import ScorerFacts, register_scorer

# An optional minus (not after a digit, so "3-4" reads 3 and 4), digits with
# optional thousands commas and decimals (or ".5"), an optional "/denominator".
_NUMBER_RE = re.compile(r"(?<![\d.])(-?)(\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:/(\d+(?:\.\d+)?))?")
MATH_REL_TOL = 1e-6
MATH_ABS_TOL = 1e-6


def last_number(text: str) -> Optional[float]:
    """The value of the last number in ``text`` (``1,000`` -> 1000, ``3/4`` -> 0.75), or None."""
    value = None
    for sign, number, denominator in _NUMBER_RE.findall(text):
        x = float(number.replace(",", ""))
        if denominator:
            d = float(denominator)
            if d == 0:
                continue  # "n/0" is not a number
            x /= d
        value = -x if sign else x
    return value


def math_score(src: str, tgt: str, response: str) -> float:
    """1.0 when the last number of the response equals the label's last number, else 0.0.

    Like PaddleNLP's GSM8K rule (the last number of the response against the last
    number of the label, so a ``"... #### 72"`` label works), but compared as
    floats with ``math.isclose(rel_tol=1e-6, abs_tol=1e-6)`` instead of as
    strings, so ``72.0``, ``72`` and ``1,000``/``1000`` agree and ``3/4`` equals
    ``0.75``. A response without a number scores 0.0; a label without a number
    raises ValueError (the label is broken).
    """
    expected = last_number(tgt)
    if expected is None:
        raise ValueError(f"math label has no number: {tgt[:200]!r}")
    got = last_number(response)
    if got is None:
        return 0.0
    return 1.0 if math.isclose(got, expected, rel_tol=MATH_REL_TOL, abs_tol=MATH_ABS_TOL) else 0.0





def reverse_score(src: str, tgt: str, response: str) -> float:
    """The demo task (``ppo/tiny/demo_data.py``): 1.0 when ``response.strip() == tgt.strip()``, else 0.0."""
    return 1.0 if response.strip() == tgt.strip() else 0.0


def _last_number_text(src: str, response: str) -> Optional[str]:
    value = last_number(response)
    return None if value is None else repr(value)


math_score.extract_answer = _last_number_text
reverse_score.extract_answer = lambda src, response: response.strip()
register_scorer("math", math_score, ScorerFacts(
    summary="last number of the response equals the label's last number (floats, 1e-6 tolerance)",
    values="{0, 1}", label="text whose last number is the answer (e.g. '... #### 72')",
    lowest_when="a different number, or no number in the response", raises_when="the label has no number",
    correct_at=1.0,
))
register_scorer("reverse", reverse_score, ScorerFacts(
    summary="the demo task: the stripped response equals the stripped label",
    values="{0, 1}", label="the exact answer", lowest_when="any other text", correct_at=1.0,
))
