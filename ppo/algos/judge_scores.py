"""Scores of a generative judge from the logits of the token after its rubric prompt.

A model-as-judge (RLAIF, Lee et al. 2023; self-rewarding LMs, Yuan et al. 2024; TRL's
`PairRMJudge`/`OpenAIPairwiseJudge` for the pairwise form) reads a prompt that asks for a verdict
and is scored by the probability it gives the verdict tokens, never by sampled text:

* yes/no: ``p = P(yes) / (P(yes) + P(no)) = sigmoid(z_yes - z_no)`` (the two tokens'
  probabilities renormalised, so the mass on other tokens does not count; the temperature-free
  logit difference);
* a score among tokens ``s_1..s_n`` (e.g. "1".."10"): the expectation under the distribution
  renormalised over those tokens, ``E = sum_i softmax(z_s)_i v_i``, mapped to [0, 1] by
  ``(E - min v) / (max v - min v)`` (G-Eval's probability-weighted score, Liu et al. 2023);
* pairwise: ``P(A better)`` from the verdict tokens "A"/"B", asked in both orders to cancel the
  judge's position bias: ``(p(A first) + 1 - p(A second)) / 2`` where the second prompt shows
  the answers swapped.
"""
import paddle

__all__ = ["verdict_probability", "expected_score", "order_averaged_preference"]


def verdict_probability(logits, yes_id, no_id):
    """``P(yes) / (P(yes) + P(no)) = sigmoid(z_yes - z_no)`` per row.
    Shapes: ``logits [B, V]``, token ids ints -> ``[B]`` (the logits' dtype)."""
    return paddle.nn.functional.sigmoid(logits[:, int(yes_id)] - logits[:, int(no_id)])


def expected_score(logits, token_ids, values):
    """The verdict distribution renormalised over ``token_ids`` (softmax of their logits), its
    expected value ``sum_i p_i values_i`` mapped to [0, 1] by ``(E - min) / (max - min)``.
    Shapes: ``logits [B, V]``, ``token_ids`` and ``values`` length-n sequences (n >= 2, values
    not all equal) -> ``[B]``."""
    if len(token_ids) != len(values) or len(values) < 2:
        raise ValueError(f"need at least two score tokens with one value each, got {len(token_ids)} and {len(values)}")
    low, high = float(min(values)), float(max(values))
    if high == low:
        raise ValueError(f"score values must not all be equal, got {list(values)}")
    picked = paddle.gather(logits, paddle.to_tensor([int(t) for t in token_ids], dtype="int64"), axis=1)
    probs = paddle.nn.functional.softmax(picked, axis=-1)
    expectation = paddle.sum(probs * paddle.to_tensor([float(v) for v in values], dtype=logits.dtype), axis=-1)
    return (expectation - low) / (high - low)


def order_averaged_preference(p_first_order, p_swapped_order):
    """``P(A better)`` from the two orders: ``(p(A first) + 1 - p(A second)) / 2``, where
    ``p_first_order`` is the judge's P("A") with the answers in order (A, B) and
    ``p_swapped_order`` its P("A") with them shown as (B, A). A judge that always prefers the
    first position gives 1/2. Shapes: ``[B]``, ``[B]`` -> ``[B]``."""
    return (p_first_order + 1.0 - p_swapped_order) / 2.0
