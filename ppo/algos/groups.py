"""Rows grouped by prompt: the ``group_size`` consecutive samples of one prompt.

Sequence-level estimators (``ppo.algos.advantage``, ``ppo.algos.pass_at_k``) take scores
``[B]`` with ``B = num_groups * group_size``, consecutive rows forming one group (the
``rollout_n`` samples of a prompt); these helpers are their one home for that layout.
"""
import paddle

__all__ = ["group_view", "zero_equal_groups"]


def group_view(scores, group_size):
    """``scores`` ``[B]`` viewed as ``[B // group_size, group_size]`` (one row per group).

    Raises ``ValueError`` for ``group_size < 1`` or a batch that is not a multiple of it.
    Example: ``[1, 2, 3, 4]`` with ``group_size = 2`` -> ``[[1, 2], [3, 4]]``.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    B = scores.shape[0]
    if B % group_size != 0:
        raise ValueError(f"batch size {B} is not a multiple of group_size {group_size}")
    return scores.reshape([B // group_size, group_size])


def zero_equal_groups(adv, g):
    """``adv`` ``[G, n]`` with rows whose scores ``g`` ``[G, n]`` are all equal set to exactly 0.

    In float32 the mean of equal numbers is not always bit-equal to them (six copies of -1.3
    have a mean 1 ulp away); dividing that residue by a tiny std would make a large advantage.
    """
    same = (paddle.max(g, axis=1, keepdim=True) == paddle.min(g, axis=1, keepdim=True)).expand(g.shape)
    return paddle.where(same, paddle.zeros_like(adv), adv)
