"""``format``: the response is a reasoning block then an answer block, ``<think>...</think>
<answer>...</answer>`` by default (DeepSeek-R1's template; TRL's and open-r1's ``format_reward``).

1.0 when the text (see below) holds exactly one opening and one closing tag of each block, the
think block before the answer block, the answer non-empty, and nothing but whitespace outside
the blocks (unless ``allow_outside``); else 0.0. Options: ``think_tag`` / ``answer_tag`` (the tag
names, e.g. ``reasoning`` / ``solution``), ``require_think`` (False: the think block may be
left out, though a second one is still wrong), ``allow_outside`` (True: text before, between
and after the blocks is fine). When the prompt ends with the opening think tag (a chat template
that opens the block, as PaddleNLP's Knights-and-Knaves prompts do), the response is read with
that tag in front. It needs no label and never raises.
"""
import re
from typing import Optional

from ..common.registry_settings import Setting
from ..scoring.registry import ScorerFacts, register_scorer

_TAG_NAME_RE = re.compile(r"[A-Za-z][\w\-]*")


def _block(text, tag):
    """(start, end, content) of the one ``<tag>...</tag>`` block of `text`, or None when the tags
    are missing, repeated or in the wrong order."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    if text.count(opening) != 1 or text.count(closing) != 1:
        return None
    start, close = text.find(opening), text.find(closing)
    if close < start:
        return None
    return start, close + len(closing), text[start + len(opening) : close]


def _tag_problem(tag):
    return None if isinstance(tag, str) and _TAG_NAME_RE.fullmatch(tag) else "tag names are words such as 'think' (no brackets)"


SETTINGS = (
    Setting("think_tag", str, "think", "Name of the reasoning block's tag.", check=_tag_problem),
    Setting("answer_tag", str, "answer", "Name of the answer block's tag.", check=_tag_problem),
    Setting("require_think", bool, True, "The think block must be there (false: it may be left out; a second one is "
            "still wrong)."),
    Setting("allow_outside", bool, False, "Text before, between and after the blocks is fine."),
)


def make_format(think_tag="think", answer_tag="answer", require_think=True, allow_outside=False):
    """The ``format`` scorer with these tag names and rules (see the module docstring)."""
    if think_tag == answer_tag:
        raise ValueError(f"format: think_tag and answer_tag must differ, both are {think_tag!r}")

    def answer_text(src: str, response: str) -> Optional[str]:
        text = f"<{think_tag}>" + response if src.rstrip().endswith(f"<{think_tag}>") else response
        answer = _block(text, answer_tag)
        if answer is None or not answer[2].strip():
            return None
        think_present = f"<{think_tag}>" in text or f"</{think_tag}>" in text
        think = _block(text, think_tag) if (require_think or think_present) else None
        if (require_think or think_present) and (think is None or think[1] > answer[0]):
            return None
        if not allow_outside:
            outside = text[: answer[0]] + text[answer[1] :]
            if think is not None:
                outside = text[: think[0]] + text[think[1] : answer[0]] + text[answer[1] :]
            if outside.strip():
                return None
        return answer[2].strip()

    def format_score(src: str, tgt: str, response: str) -> float:
        return 0.0 if answer_text(src, response) is None else 1.0

    format_score.extract_answer = answer_text
    return format_score


format_score = make_format()
register_scorer("format", format_score, ScorerFacts(
    summary="one think block then one non-empty answer block (tag names configurable), nothing outside",
    values="{0, 1}", label="not used",
    lowest_when="a tag missing, repeated or out of order, an empty answer, text outside the blocks",
    correct_at=1.0,
    settings=SETTINGS,
    build=make_format,
))
