"""Knights and Knaves: PaddleNLP's reward rule (see :func:`kk_score`)."""
import re
from typing import Dict, List, Optional

from ..scoring.registry import ScorerFacts, register_scorer

KK_FORMAT_REWARD = 1.0
KK_ANSWER_CORRECT = 2.0
KK_ANSWER_WRONG = -1.5
KK_ANSWER_UNPARSEABLE = -2.0

_KK_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_KK_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_KK_LABEL_LINE_RE = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)


def parse_kk_label(tgt: str) -> Dict[str, str]:
    """``"(1) Zoey is a knave\\n(2) Oliver is a knight"`` -> ``{"Zoey": "knave", "Oliver": "knight"}``.

    One role per non-empty line: the first word of letters on the line is the
    name, the first later ``knight``/``knave`` the role (PaddleNLP's
    ``parse_solution_text_format``). Raises ValueError when no line parses: the
    label is broken, and scoring against it would be a made-up reward.
    """
    roles = {}
    for line in tgt.splitlines():
        match = _KK_LABEL_LINE_RE.search(line.strip())
        if match:
            roles[match.group(1)] = match.group(2).lower()
    if not roles:
        raise ValueError(f"Knights-and-Knaves label has no 'NAME ... knight|knave' line: {tgt[:200]!r}")
    return roles


def kk_format_ok(text: str) -> bool:
    """Exactly one of each tag, in the order ``<think></think><answer></answer>``."""
    if any(text.count(tag) != 1 for tag in _KK_TAGS):
        return False
    positions = [text.find(tag) for tag in _KK_TAGS]
    return positions == sorted(positions)


def parse_kk_answer(answer: str, names: List[str]) -> Optional[Dict[str, str]]:
    """Roles stated in the answer for ``names``, or None when they cannot be read.

    PaddleNLP's ``parse_model_answer``: the words ``knight``/``knave`` must occur
    exactly ``len(names)`` times in total (case-insensitive, substrings count, so
    "knights" counts), and each name must appear as ``NAME is a knight|knave``.
    """
    lowered = answer.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    roles = {}
    for name in names:
        pattern = rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b"
        match = re.search(pattern, answer, re.IGNORECASE)
        if match is None:
            return None
        roles[name] = match.group(1).lower()
    return roles


def kk_score(src: str, tgt: str, response: str) -> float:
    """Knights-and-Knaves reward: format reward + answer reward, in [-3, 3].

    The rule of PaddleNLP's ``llm/alignment/ppo/reward_server.py`` (``compute_score``,
    derived from Logic-RL's ``kk.py``):

    1. Text scored. PaddleNLP's KK prompt ends with ``<think>`` (the chat template
       opens the think block), so PaddleNLP prepends ``<think>`` to every
       response. Here that happens only when ``src`` ends with ``<think>``
       (ignoring trailing whitespace); otherwise the response must open the block
       itself. Either way a second ``<think>`` is a format error.
    2. Format: +1 when the text has exactly one each of ``<think>``, ``</think>``,
       ``<answer>``, ``</answer>`` in that order; otherwise -1.
    3. Answer (the content of the last ``<answer>...</answer>``, stripped), scored
       only when the format is right and the answer is non-empty:
       +2 when every role of the label matches, -1.5 when all roles could be read
       but one differs, -2 when they cannot be read (wrong number of
       knight/knave words, or a name without ``NAME is a knight|knave``).
       A wrong format or an empty/missing answer gives -2: PaddleNLP does NOT
       score the answer when the format is wrong.

    Totals: 3.0 (right), -0.5 (well formed, wrong roles), -1.0 (well formed,
    unreadable answer), -3.0 (bad format, whatever the answer).

    Differences from PaddleNLP: its chat-header split (``Assistant:`` /
    ``<|im_start|>assistant``) is not applied, since the response arrives without
    the prompt; a label with no parseable role raises ValueError instead of
    scoring every response -2.
    """
    gt = parse_kk_label(tgt)
    text = "<think>" + response if src.rstrip().endswith("<think>") else response
    format_ok = kk_format_ok(text)
    format_score = KK_FORMAT_REWARD if format_ok else -KK_FORMAT_REWARD

    answer_score = KK_ANSWER_UNPARSEABLE
    if format_ok:
        matches = _KK_ANSWER_RE.findall(text)
        answer = matches[-1].strip() if matches else ""
        if answer:
            predicted = parse_kk_answer(answer, list(gt))
            if predicted is not None:
                answer_score = KK_ANSWER_CORRECT if predicted == gt else KK_ANSWER_WRONG
    return float(format_score + answer_score)


def kk_answer(src: str, response: str) -> Optional[str]:
    """The stripped content of the last ``<answer>...</answer>`` (None without one), for votes."""
    matches = _KK_ANSWER_RE.findall(response)
    return matches[-1].strip() if matches else None


kk_score.extract_answer = kk_answer
register_scorer("kk", kk_score, ScorerFacts(
    summary="Knights and Knaves (PaddleNLP's reward_server.py): format +1/-1 plus answer +2/-1.5/-2",
    values="3 (right), -0.5 (wrong roles), -1 (unreadable answer), -3 (bad format)",
    label="one 'NAME is a knight|knave' per line",
    lowest_when="tags missing, repeated or out of order: -3 whatever the answer",
    raises_when="the label has no 'NAME ... knight|knave' line",
    correct_at=3.0,
))
