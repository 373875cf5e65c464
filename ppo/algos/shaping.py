"""Sequence-level reward shaping and loss masking for RL recipes (DAPO, TRL).

Plain functions on paddle tensors; inputs are never written into.
"""
import paddle

__all__ = ["overlong_penalty", "truncated_completion_mask"]


def overlong_penalty(lengths, max_len, buffer_len, penalty_factor):
    """DAPO's soft overlong punishment, added to the score of each response.

    Formula with ``L_exp = max_len - buffer_len`` (``lengths`` = response tokens):
    ``p = min(-(len - L_exp) / buffer_len * penalty_factor, 0)``, i.e. 0 up to
    ``L_exp`` tokens, then falling linearly to ``-penalty_factor`` at ``max_len``
    (and further below beyond it).
    Example: ``max_len 10, buffer_len 4, factor 1``: lengths ``[3, 6, 7, 10]`` ->
    ``[0, 0, -0.25, -1]``.
    Shapes: ``lengths`` ``[B]`` (any numeric dtype) -> ``[B]`` float32 (float64 in, float64 out).
    Source: Yu et al. 2025 (DAPO, eq. 13); verl ``DAPORewardManager`` (``overlong_buffer``).
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"overlong buffer_len must be in (0, max_len={max_len}], got {buffer_len}")
    dtype = "float64" if lengths.dtype == paddle.float64 else "float32"
    exceed = lengths.astype(dtype) - float(max_len - buffer_len)
    return paddle.clip(-exceed / float(buffer_len) * float(penalty_factor), max=0.0)


def truncated_completion_mask(mask, ends_with_eos):
    """Response mask with the rows that did not stop (no EOS) zeroed out.

    Formula: ``out[b, t] = mask[b, t] * [ends_with_eos[b]]``; a truncated completion
    then adds nothing to any loss (nor to its token or sequence counts).
    Example: mask ``[[1, 1], [1, 1]]``, ends ``[True, False]`` -> ``[[1, 1], [0, 0]]``.
    Shapes: ``mask`` ``[B, T]``, ``ends_with_eos`` ``[B]`` bool -> ``[B, T]`` (mask's dtype).
    Source: TRL ``GRPOConfig.mask_truncated_completions`` (DAPO's overlong filtering).
    """
    m = mask.astype("float32") if mask.dtype == paddle.bool else mask
    keep = ends_with_eos.astype(m.dtype).reshape([-1, 1])
    return m * keep
