"""Reading a final answer written in LaTeX: the last ``\\boxed{}``, a normal form, its number.

The normal form follows the answer normalisation of Hendrycks et al.'s MATH grader
(``strip_string`` in ``hendrycks/math``, ``modeling/math_equivalence.py``) and of Minerva
(Lewkowycz et al. 2022, ``normalize_final_answer``, as in verl's ``reward_score/math_dapo.py``),
rewritten here: see :func:`normalize`.
"""
import re
from fractions import Fraction
from typing import Optional

_BOX_COMMANDS = ("\\boxed", "\\fbox")

# Units dropped after a number: any of these inside \text{} / \mbox{} / \mathrm{} at the end
# ("10\text{ cm}^2", "3\,\mathrm{m}"); written bare ("5 cm", "3 dollars") only those of two letters or
# more ("2m" may be a product, "5 in" a preposition).
UNIT_WORDS = (
    "square units|square feet|square inches|square meters|square cm|sq units|units|unit|cm|mm|km|meters|meter|"
    "inches|inch|feet|foot|ft|yards|yd|miles|mile|mph|kg|gm|grams|pounds|lbs|lb|ounces|oz|liters|ml|"
    "seconds|second|sec|minutes|minute|min|hours|hour|hrs|hr|days|day|weeks|years|year|dollars|dollar|cents|"
    "degrees|degree|points|ways|students|people|percent"
)
_POWER = r"(?:\^\{?[23]\}?)?"
_TEXT_UNIT_RE = re.compile(rf"\\(?:text|mbox|mathrm)\s*\{{\s*(?:{UNIT_WORDS}|m|s|g|l|in)\s*\}}{_POWER}\s*$")
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|mathbf|operatorname)\s*\{([^{}]*)\}")
_UNIT_TAIL_RE = re.compile(rf"(?<=[\d}}).])\s*(?:{UNIT_WORDS}){_POWER}\s*$")
_THOUSANDS_RE = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+)(?![\d,])")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
_FRAC_HALF_SHORT_RE = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\w)")
_EQUATION_LHS_RE = re.compile(r"^[a-zA-Z]\w{0,2}(?:\([a-z]\))?\s*=\s*(?=[^=])")
_NUMBER_RE = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:e-?\d+)?")
_FRAC_NUM_RE = re.compile(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}")
_SLASH_NUM_RE = re.compile(r"(-?[\d.]+)/(-?[\d.]+)")
_EXPONENT_RE = re.compile(r"(?:e|\^\{?)-?(\d+)")
_TIMES_TEN_RE = re.compile(r"(-?(?:\d+(?:\.\d*)?|\.\d+))(?:\\times|\\cdot|\*)10\^\{?(-?\d+)\}?")


def _braced(text, start):
    """The content of the group opening at `text[start] == "{"` and the index after it; escaped
    braces (``\\{``) do not count. (None, start) when it does not close."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None, start


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces kept), or of
    ``\\boxed 5`` (up to a space or ``$``); None when there is none or its braces do not close."""
    starts = [(text.rfind(cmd), cmd) for cmd in _BOX_COMMANDS]
    pos, cmd = max(starts)
    if pos < 0:
        return None
    i = pos + len(cmd)
    if text.startswith("{", i):
        content, _ = _braced(text, i)
        return content
    rest = text[i:]
    if not rest[:1].isspace():
        return None
    word = rest.strip().split("$")[0].split()
    return word[0] if word else None


def _unwrap_text(s):
    """``\\text{cm}`` -> `` cm``: text commands keep their words (the unit step drops units)."""
    previous = None
    while previous != s:
        previous, s = s, _TEXT_CMD_RE.sub(lambda m: " " + m.group(1).strip(), s)
    return s


def normalize(answer: str) -> str:
    """A normal form of a LaTeX answer: equal forms mean equal answers (the converse is for
    :func:`number` and the symbolic check). In order: ``\\dfrac``/``\\tfrac`` -> ``\\frac``;
    ``\\left``/``\\right``, ``\\!``, ``\\,``, ``\\;``, ``\\displaystyle`` and ``$`` dropped; text
    commands unwrapped; degrees (``^\\circ``, ``°``), percent (``\\%``, ``%``) and a trailing unit
    after a number dropped (``5\\text{ cm}`` -> ``5``); a leading ``x =`` dropped; thousands
    separators dropped (``1,000`` and ``1{,}000`` -> ``1000``, only in groups of three);
    ``\\frac12`` -> ``\\frac{1}{2}``, ``\\sqrt2`` -> ``\\sqrt{2}``; spaces and a final period dropped."""
    s = answer.strip().replace("\n", " ")
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
                     ("\\displaystyle", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""), ("\\ ", " "),
                     ("{,}", ","), ("\\$", ""), ("$", ""), ("\\%", ""), ("%", ""), ("^{\\circ}", ""),
                     ("^\\circ", ""), ("\\circ", ""), ("°", ""), ("\\degree", "")):
        s = s.replace(old, new)
    s = _TEXT_UNIT_RE.sub("", s.strip())
    s = _unwrap_text(s)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    for _ in range(2):  # "5 square units", then a second word
        s = _UNIT_TAIL_RE.sub("", s).strip()
    s = _EQUATION_LHS_RE.sub("", s)
    s = _THOUSANDS_RE.sub(lambda m: m.group(1).replace(",", ""), s)
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    if s.startswith("{") and s.endswith("}") and _braced(s, 0)[1] == len(s):
        s = s[1:-1]
    return s.rstrip(".")


def number(normalized: str) -> Optional[Fraction]:
    """The exact value of a normal form that is a plain number: ``-3``, ``0.5``, ``.5``, ``1e3``,
    ``2.5\\times10^{3}``, ``\\frac{1}{2}``, ``-\\frac{3}{4}``, ``1/2``; None for anything else."""
    s = normalized
    if any(len(e) > 3 for e in _EXPONENT_RE.findall(s)):
        return None  # 10^{10^9} is left to the symbolic check and its limits
    try:
        if _NUMBER_RE.fullmatch(s):
            return Fraction(s)
        m = _TIMES_TEN_RE.fullmatch(s)
        if m:
            return Fraction(m.group(1)) * Fraction(10) ** int(m.group(2))
        m = _FRAC_NUM_RE.fullmatch(s)
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) else value
        m = _SLASH_NUM_RE.fullmatch(s)
        if m:
            return Fraction(m.group(1)) / Fraction(m.group(2))
    except (ValueError, ZeroDivisionError):
        return None
    return None
