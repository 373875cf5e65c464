"""The demo task's prompts and answers (string reversal with a flawed demonstrator, see
`ppo.tiny.demo_data`): the correct answer, the demonstrator's flaw and the other wrong answers
the preference data pairs against it. Pure functions of their inputs and a `random.Random`."""


ALPHABET = "abcdefghij0123456789"
MIN_LEN, MAX_LEN = 3, 7
FLAW_MIN_LEN = 5
PROMPT_PREFIX = "Reverse: "


def reverse_prompt(s):
    return PROMPT_PREFIX + s


def correct_answer(s):
    return s[::-1]


def flawed_answer(s):
    """The demonstrator's systematic mistake: first two output characters swapped."""
    r = s[::-1]
    return r[1] + r[0] + r[2:]


def demonstrate(s, rng, flaw_prob):
    """The flawed demonstrator's answer for string `s`."""
    if len(s) >= FLAW_MIN_LEN and rng.random() < flaw_prob:
        return flawed_answer(s)
    return correct_answer(s)


def random_adjacent_swap(answer, rng):
    """`answer` with one random pair of different adjacent characters swapped."""
    positions = [i for i in range(len(answer) - 1) if answer[i] != answer[i + 1]]
    if not positions:
        return answer[:-1]  # all characters equal: drop one instead
    i = rng.choice(positions)
    return answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :]


def degenerate_answer(answer, rng):
    """An answer a reward model must rank low: empty, truncated or one symbol repeated."""
    kind = rng.choice(["empty", "truncated", "repeated"])
    if kind == "empty":
        return ""
    if kind == "truncated":
        return answer[: rng.randint(1, max(1, len(answer) - 1))]
    return answer[0] * rng.randint(1, 2 * MAX_LEN)


def half_fixed_answer(answer, rng):
    """`answer` with one of its first two characters written in both places: the near miss
    between the flaw and the answer. With the flaw as the only near miss, a reward model
    can rank pairs by looking at a single one of the first two characters."""
    first = answer[rng.randint(0, 1)]
    return first + first + answer[2:]


def wrong_symbol_answer(answer, rng):
    """`answer` with one of its first two characters replaced by another symbol. Without
    such pairs a reward model can tell the flaw and its half-fixes from the answer by the
    order and repetition of the first two characters alone, never checking which symbols
    they are, and a policy trained on it writes any symbol there."""
    i = rng.randint(0, 1)
    wrong = rng.choice([c for c in ALPHABET if c != answer[i]])
    return answer[:i] + wrong + answer[i + 1 :]


def rejected_answer(s, rng, degenerate_frac, swap_frac, half_fix_frac=0.0, wrong_symbol_frac=0.0):
    """The worse response of a preference pair for string `s`: a degenerate answer
    (`degenerate_frac` of pairs); of the rest, a random adjacent swap (`swap_frac`, and
    wherever the first two output characters are equal), a half-fixed flaw
    (`half_fix_frac`), a wrong symbol in the first two places (`wrong_symbol_frac`), else
    the demonstrator's flaw (first two output characters swapped) -- on short strings too,
    where it is the same kind of mistake the reward model must learn to see."""
    if swap_frac + half_fix_frac + wrong_symbol_frac > 1.0:
        raise ValueError(f"swap_frac + half_fix_frac + wrong_symbol_frac must be at most 1, got {swap_frac} + "
                         f"{half_fix_frac} + {wrong_symbol_frac}")
    correct = correct_answer(s)
    if rng.random() < degenerate_frac:
        return degenerate_answer(correct, rng)
    if correct[0] != correct[1]:
        u = rng.random()
        if u >= swap_frac + half_fix_frac + wrong_symbol_frac:
            return flawed_answer(s)
        if u >= swap_frac + half_fix_frac:
            return wrong_symbol_answer(correct, rng)
        if u >= swap_frac:
            return half_fixed_answer(correct, rng)
    return random_adjacent_swap(correct, rng)
