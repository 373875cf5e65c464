"""Rule-based scorers for the HTTP reward server (`ppo/reward_server.py`).

A scorer is a PURE function ``score(src: str, tgt: str, response: str) -> float``:
``src`` is the decoded prompt, ``tgt`` the label of the prompt (the dataset's
``tgt``), ``response`` the decoded completion without the prompt. This is the
triple PaddleNLP's trainer posts to its reward server (its
``request_reward_server`` decodes ``input_ids[:, :prompt_len]`` as src, the label
ids as tgt and ``input_ids[:, prompt_len:]`` as response). A scorer has no state,
does no I/O and may be called from many server threads at once.

A scorer that cannot score an item (for example a label it cannot parse) raises
an exception; the server then answers HTTP 500 naming the item. It never returns
a made-up value such as 0.0: a reward that cannot be computed is an error.

Built-in scorers (chosen by name):

- ``kk``: Knights and Knaves, PaddleNLP's rules (see :func:`kk_score`);
- ``math``: last number of the response equals the last number of the label
  (see :func:`math_score`);
- ``reverse``: the toolkit's demo task, exact match after stripping whitespace
  (see :func:`reverse_score`).

Several scorers with weights
----------------------------
:class:`WeightedScorer` combines scorers by name: ``total = sum_k w_k * score_k``
(``--scorer kk,math --weights 1,0.5`` on the server; ``rule_reward_scorers`` /
``rule_reward_weights`` in the trainer with ``use_rule_reward``). Both use
:meth:`WeightedScorer.score_batch`, which returns the totals and each function's
scores, and raises :class:`ScorerError` naming the scorer and the item when one
raises or returns something that is not a finite number.

Adding your own scorer
----------------------
Register a function under a name, in a module of yours::

    # my_rewards.py
    from ppo.scorers import register_scorer

    @register_scorer("length_penalty")
    def length_penalty(src, tgt, response):
        return 1.0 if response.strip() == tgt.strip() else -0.01 * len(response)

and either import that module before creating the app
(``create_app("length_penalty")``), or skip registration entirely and name the
function on the command line as ``module.path:function``::

    python ppo/reward_server.py --scorer my_rewards:length_penalty

:func:`get_scorer` imports the module (the server script also searches the
directory it is started from), registers the function under the name
``my_rewards:length_penalty`` and returns it.
"""
import importlib
import math
import numbers
import re
import threading
from typing import Callable, Dict, List, Optional

Scorer = Callable[[str, str, str], float]

_REGISTRY: Dict[str, Scorer] = {}
_REGISTRY_LOCK = threading.Lock()


def register_scorer(name: str, fn: Optional[Scorer] = None):
    """Register ``fn`` as the scorer called ``name``; usable as a decorator.

    ``@register_scorer("mine")`` above a function, or ``register_scorer("mine", fn)``.
    Registering the same function again under the same name is a no-op (so a
    module imported twice does not fail); a different function under a taken name
    raises ValueError. Returns the function unchanged.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"scorer name must be a non-empty string, got {name!r}")

    def decorator(func: Scorer) -> Scorer:
        if not callable(func):
            raise TypeError(f"scorer {name!r} must be callable, got {type(func).__name__}")
        with _REGISTRY_LOCK:
            existing = _REGISTRY.get(name)
            if existing is not None and existing is not func:
                raise ValueError(f"a different scorer is already registered as {name!r}: {existing!r}")
            _REGISTRY[name] = func
        return func

    if fn is not None:
        return decorator(fn)
    return decorator


def list_scorers() -> List[str]:
    """Names of the registered scorers, sorted."""
    with _REGISTRY_LOCK:
        return sorted(_REGISTRY)


def load_scorer(spec: str) -> Scorer:
    """Import ``module.path:function``, register it under ``spec`` and return it."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"scorer spec {spec!r} must look like 'module.path:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} for scorer {spec!r}: {err}") from err
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (scorer {spec!r})") from None
    if not callable(obj):
        raise ValueError(f"scorer {spec!r} is not callable (got {type(obj).__name__})")
    return register_scorer(spec, obj)


def get_scorer(name: str) -> Scorer:
    """The scorer registered as ``name``, or imported from ``module.path:function``.

    Raises ValueError naming the valid choices when ``name`` is unknown.
    """
    with _REGISTRY_LOCK:
        fn = _REGISTRY.get(name)
    if fn is not None:
        return fn
    if isinstance(name, str) and ":" in name:
        return load_scorer(name)
    raise ValueError(
        f"unknown scorer {name!r}; valid names: {', '.join(list_scorers())} "
        "(or 'module.path:function' for your own)"
    )


class ScorerError(ValueError):
    """A scorer raised, or returned a non-finite / non-number value, on one item."""

    def __init__(self, message, scorer_name, item, bad_value=False):
        super().__init__(message)
        self.scorer_name, self.item, self.bad_value = scorer_name, item, bad_value


def is_real_number(value):
    """True for int/float and numpy integer/floating scalars (anything `numbers.Real`), not bools."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def parse_scorer_list(scorers, weights=None):
    """``"kk,math"``, ``"1,0.5"`` -> ``(["kk", "math"], [1.0, 0.5])``.

    Lists may also be python lists. Weights default to 1 each; a count that differs
    from the scorers', a non-number or a non-finite weight, an empty or repeated
    scorer name raise ValueError naming the problem.
    """
    names = [n.strip() for n in scorers.split(",")] if isinstance(scorers, str) else [str(n).strip() for n in scorers]
    if not names or any(not n for n in names):
        raise ValueError(f"scorer list {scorers!r} has an empty name; write names separated by commas, e.g. 'kk,math'")
    if len(set(names)) != len(names):
        raise ValueError(f"scorer list {scorers!r} names a scorer twice")
    if weights is None or (isinstance(weights, str) and not weights.strip()) or (not isinstance(weights, str) and not weights):
        return names, [1.0] * len(names)
    raw = weights.split(",") if isinstance(weights, str) else list(weights)
    if len(raw) != len(names):
        raise ValueError(f"{len(raw)} weights ({weights!r}) for {len(names)} scorers ({', '.join(names)}); give one per scorer")
    values = []
    for name, w in zip(names, raw):
        try:
            value = float(w)
        except (TypeError, ValueError):
            raise ValueError(f"weight {w!r} of scorer {name!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"weight {w!r} of scorer {name!r} is not finite")
        values.append(value)
    return names, values


class WeightedScorer:
    """Scorers ``names`` with ``weights``: the total of an item is ``sum_k w_k * score_k``.

    ``WeightedScorer("reverse")``, ``WeightedScorer("kk,math", "1,0.5")`` or with lists.
    Unknown names raise ValueError at construction (see :func:`get_scorer`).
    """

    def __init__(self, names, weights=None):
        self.names, self.weights = parse_scorer_list(names, weights)
        self.functions = [get_scorer(n) for n in self.names]

    @property
    def spec(self):
        return ",".join(self.names)

    def score_batch(self, src, tgt, response):
        """Score every item with every scorer.

        Returns ``(totals, per_function)``: ``totals`` a list of floats (one per item),
        ``per_function`` a dict name -> list of that scorer's raw scores. Raises
        :class:`ScorerError` naming the scorer and item on the first failure.
        """
        if not len(src) == len(tgt) == len(response):
            raise ValueError(f"src, tgt and response have {len(src)}, {len(tgt)}, {len(response)} items; they must match")
        per_function = {n: [] for n in self.names}
        totals = []
        for i, (s, t, r) in enumerate(zip(src, tgt, response)):
            total = 0.0
            for name, fn, w in zip(self.names, self.functions, self.weights):
                try:
                    value = fn(s, t, r)
                except Exception as err:  # the scorer's bug or a broken label: report, never guess
                    raise ScorerError(
                        f"scorer '{name}' raised on item {i}: {type(err).__name__}: {err}", name, i
                    ) from err
                if not is_real_number(value) or not math.isfinite(float(value)):
                    raise ScorerError(
                        f"scorer '{name}' returned {value!r} for item {i}; a score must be a finite number",
                        name, i, bad_value=True,
                    )
                per_function[name].append(float(value))
                total += w * float(value)
            totals.append(total)
        return totals, per_function


# --------------------------------------------------------------------------------------
# Knights and Knaves
# --------------------------------------------------------------------------------------

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


@register_scorer("kk")
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


# --------------------------------------------------------------------------------------
# Math: last number
# --------------------------------------------------------------------------------------

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


@register_scorer("math")
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


# --------------------------------------------------------------------------------------
# Reverse: the demo task
# --------------------------------------------------------------------------------------


@register_scorer("reverse")
def reverse_score(src: str, tgt: str, response: str) -> float:
    """The demo task (``ppo/tiny/demo_data.py``): 1.0 when ``response.strip() == tgt.strip()``, else 0.0."""
    return 1.0 if response.strip() == tgt.strip() else 0.0
