"""GSM8K answers, PaddleNLP's rule: ``gsm8k`` (strict ``#### n``, its default) and ``gsm8k_flexible``.

PaddleNLP scores GSM8K in ``paddlenlp/rl/trainer/reward_trainer.py`` (``RewardTrainer.compute_score``,
``method="strict"``, ``score=1.0``, ``format_score=0.0``) with ``extract_solution`` of
``paddlenlp/rl/models/reward_utils.py`` (the rule of verl's ``utils/reward_score/gsm8k.py``):

- strict: the LAST match of ``#### (-?[0-9.,]+)`` (exactly one space after ``####``), with
  ``,`` and ``$`` removed: ``#### 1,000`` reads ``1000``; ``####72`` and ``#### $5`` read nothing;
- flexible: the last match of ``-?[0-9.,]+`` that is not ``""`` or ``"."``, kept as written
  (commas and a trailing period stay: ``1,000`` and ``72.`` are read as such);
- the answer read is compared with the label AS A STRING: 1.0 when equal, else 0.0 (also when
  nothing is read). So ``#### 72.0`` against ``72`` scores 0, as in PaddleNLP; the ``math``
  scorer compares numbers instead.

The label is what PaddleNLP's ``llm/alignment/rl/gsm8k_processor.py`` writes as ``tgt`` (the
number after ``####``, commas removed); a full GSM8K solution (``... #### 72``) is accepted too and
read the way that script reads it (the first ``#### n``). A label that is not a number raises:
the reward cannot be computed. Differences from PaddleNLP: the label is stripped of surrounding
whitespace (PaddleNLP compares the decoded label with its pad tokens removed); no other.
"""
import re
from typing import Optional

from ..scoring.registry import ScorerFacts, register_scorer

_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE_RE = re.compile(r"(\-?[0-9\.\,]+)")
_LABEL_RE = re.compile(r"-?[0-9.]+")


def extract_solution(text: str, method: str = "strict") -> Optional[str]:
    """The answer PaddleNLP's rule reads from `text` (``"strict"`` or ``"flexible"``), or None."""
    if method == "strict":
        found = _STRICT_RE.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    if method != "flexible":
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    found = [m for m in _FLEXIBLE_RE.findall(text) if m not in ("", ".")]
    return found[-1] if found else None


def gsm8k_label(tgt: str) -> str:
    """The reference answer of `tgt`: the number after its first ``#### `` (commas removed, as
    ``gsm8k_processor.py`` writes ``tgt``), or the stripped label; ValueError when that is not a number."""
    match = _STRICT_RE.search(tgt)
    label = match.group(1).replace(",", "") if match else tgt.strip()
    if not _LABEL_RE.fullmatch(label) or not any(c.isdigit() for c in label):
        raise ValueError(f"gsm8k label is not a number written as gsm8k_processor.py writes it (digits, '-', '.', "
                         f"no commas), nor a solution ending '#### n': {tgt[:200]!r}")
    return label


def _make(method):
    def score(src: str, tgt: str, response: str) -> float:
        expected = gsm8k_label(tgt)
        answer = extract_solution(response, method)
        return 1.0 if answer is not None and answer == expected else 0.0

    score.extract_answer = lambda src, response: extract_solution(response, method)
    score.__name__ = f"gsm8k_{method}_score"
    score.__doc__ = f"PaddleNLP's GSM8K rule, {method} mode: 1.0 when the answer read equals the label, else 0.0."
    return score


gsm8k_score = _make("strict")
gsm8k_flexible_score = _make("flexible")

register_scorer("gsm8k", gsm8k_score, ScorerFacts(
    summary="PaddleNLP's GSM8K rule, strict (its default): the last '#### n' equals the label as a string",
    values="{0, 1}", label="the number ('72'), or a GSM8K solution ending '#### 72'",
    lowest_when="no '#### n' (one space after ####), or another string ('72.0' is not '72')",
    raises_when="the label is not a number", correct_at=1.0,
))
register_scorer("gsm8k_flexible", gsm8k_flexible_score, ScorerFacts(
    summary="PaddleNLP's GSM8K rule, flexible: the last number in the text equals the label as a string",
    values="{0, 1}", label="as gsm8k",
    lowest_when="no number, or another string ('1,000' and '72.' are read as written)",
    raises_when="the label is not a number", correct_at=1.0,
))
