"""Penalties to add to a verifier with a weight: ``length`` and ``repetition``. Neither needs a
label nor says whether an answer is correct (no ``correct_at``), and neither raises.

``length`` (DAPO's soft overlong punishment, Yu et al. 2025, on characters so that a reward
server can apply it): 0 while the response has at most ``max_chars - buffer_chars``
characters, then falling linearly to -1 at ``max_chars``, and -1 beyond. The trainer's
``enable_overlong_reward_buffer`` applies the same rule on tokens.

``repetition`` (open-r1's ``get_repetition_penalty_reward``, Demystifying Long CoT, Yeo et al.
2025): with the response's words (split at whitespace, lower-cased) cut into n-grams of
``ngram_size``, the penalty is ``max_penalty * (1 - distinct n-grams / n-grams)``: 0 for no
repeated n-gram, ``max_penalty`` (default -1) in the limit of one n-gram repeated; 0 for a
response shorter than one n-gram.
"""
from ..common.registry_settings import Setting
from ..scoring.registry import ScorerFacts, register_scorer

LENGTH_SETTINGS = (
    Setting("max_chars", int, 4096, "Characters at and beyond which the penalty is -1.", bounds=(1, True, None, False)),
    Setting("buffer_chars", int, 1024, "The last characters before max_chars over which the penalty falls from 0 to "
            "-1 (at most max_chars).", bounds=(1, True, None, False)),
)
REPETITION_SETTINGS = (
    Setting("ngram_size", int, 3, "Words per n-gram.", bounds=(1, True, None, False)),
    Setting("max_penalty", float, -1.0, "The penalty of one n-gram repeated throughout (<= 0).",
            check=lambda value: None if value <= 0 else "must be <= 0"),
)


def make_length(max_chars=4096, buffer_chars=1024):
    """The ``length`` penalty (see the module docstring)."""
    max_chars, buffer_chars = int(max_chars), int(buffer_chars)
    problems = length_problems(max_chars, buffer_chars)
    if problems:
        raise ValueError(f"length: {problems[0]}")

    def length_penalty(src: str, tgt: str, response: str) -> float:
        over = len(response) - (max_chars - buffer_chars)
        return 0.0 if over <= 0 else -min(1.0, over / buffer_chars)

    return length_penalty


def length_problems(max_chars=4096, buffer_chars=1024):
    """`buffer_chars` at most `max_chars` (each one's own range is its declaration's)."""
    return [] if buffer_chars <= max_chars else [f"need buffer_chars <= max_chars, got {buffer_chars}, {max_chars}"]


def make_repetition(ngram_size=3, max_penalty=-1.0):
    """The ``repetition`` penalty (see the module docstring)."""
    ngram_size, max_penalty = int(ngram_size), float(max_penalty)

    def repetition_penalty(src: str, tgt: str, response: str) -> float:
        words = response.lower().split()
        grams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
        if not grams:
            return 0.0
        return max_penalty * (1.0 - len(set(grams)) / len(grams))

    return repetition_penalty


register_scorer("length", make_length(), ScorerFacts(
    summary="soft overlong penalty on characters (DAPO): 0, then linear to -1 over the last buffer_chars",
    values="[-1, 0]", label="not used", lowest_when="at least max_chars characters: -1",
    settings=LENGTH_SETTINGS, build=make_length, check=length_problems,
))
register_scorer("repetition", make_repetition(), ScorerFacts(
    summary="repeated word n-grams (open-r1): max_penalty * (1 - distinct / all n-grams)",
    values="[max_penalty, 0]", label="not used", lowest_when="one n-gram repeated throughout",
    settings=REPETITION_SETTINGS, build=make_repetition,
))
