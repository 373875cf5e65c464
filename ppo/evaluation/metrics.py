"""Metrics of n sampled answers per prompt: pass@k, maj@k, mean@k. Pure functions, no paddle.

- pass@k, the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
  on Code", eq. 1): with n samples of which c are correct,
  ``pass@k = 1 - C(n - c, k) / C(n, k)``, the probability that k samples drawn without
  replacement from the n hold a correct one. Computed as the paper's numpy code does,
  ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``, which never forms the binomials (no overflow
  for large n); 1.0 when ``n - c < k``.
- maj@k: the answer given most often among the first k samples (answers as a verifier reads
  them; samples without an answer do not vote; a tie goes to the answer seen first) is taken
  as the prompt's answer; 1.0 when a sample giving it is correct, 0.0 otherwise (also when no
  sample gives an answer).
- mean@k: the fraction of the first k samples that are correct (the mean of pass@1 over them).

Every metric is averaged over prompts.
"""
from collections import Counter
from typing import Dict, List, Optional, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with `n` samples, `c` of them correct (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def majority_correct(answers: Sequence[Optional[str]], correct: Sequence[bool]) -> float:
    """1.0 when the most frequent answer (ties: the first seen; None does not vote) belongs to a
    correct sample, else 0.0."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == top)
    return 1.0 if any(ok for a, ok in zip(answers, correct) if a == winner) else 0.0


def default_ks(n: int) -> List[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def sampled_metrics(correct: Sequence[Sequence[bool]], answers: Sequence[Sequence[Optional[str]]],
                    ks: Optional[Sequence[int]] = None, prefix: str = "") -> Dict[str, float]:
    """``pass@k`` for each k of `ks` (default :func:`default_ks`), ``maj@n`` and ``mean@n`` over
    prompts, from per-prompt lists of n verdicts and n answers (n the same for every prompt)."""
    if not correct:
        raise ValueError("no prompts to evaluate")
    n = len(correct[0])
    if n == 0 or any(len(row) != n for row in correct) or len(answers) != len(correct) or any(
            len(a) != n for a in answers):
        raise ValueError("every prompt needs the same number (>= 1) of verdicts and answers")
    ks = default_ks(n) if ks is None else sorted(set(ks))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    out = {f"{prefix}pass@{k}": mean([pass_at_k(n, sum(map(bool, row)), k) for row in correct]) for k in ks}
    out[f"{prefix}maj@{n}"] = mean([majority_correct(a, row) for a, row in zip(answers, correct)])
    out[f"{prefix}mean@{n}"] = mean([sum(map(bool, row)) / n for row in correct])
    return out
