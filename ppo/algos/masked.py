"""Masked reductions over response tokens.

Conventions used throughout ``ppo.algos``:

* ``x`` and ``mask`` have the same shape (usually ``[B, T]``);
* ``mask`` is 1 on tokens that count (response tokens) and 0 elsewhere; it may be
  float, int or bool.  Float masks may also carry weights;
* values at masked-out positions never influence a result or a gradient, even if they
  are huge, NaN or infinite: every loss first passes its inputs through
  :func:`zero_masked_inputs` (``paddle.where``, whose gradient at a masked-out position is
  0 whatever the value there), so no ``0 * inf`` or ``0 * NaN`` is ever formed;
* no function writes into its inputs or calls ``.item()``/``.numpy()``.
"""
import paddle

__all__ = [
    "last_nonzero_index", "masked_centered_square_sum", "masked_mean", "masked_sum", "masked_var", "masked_whiten",
    "whiten_with_statistics", "zero_masked_inputs",
]


def _float_mask(mask, x):
    """Return ``mask`` as a float tensor with the dtype of ``x``."""
    if not isinstance(mask, paddle.Tensor):
        mask = paddle.to_tensor(mask)
    return mask.astype(x.dtype)


def _zero_outside(x, mask_f):
    """``x`` where ``mask_f != 0``, else 0 (so garbage, even NaN, cannot leak in)."""
    return paddle.where(mask_f != 0, x, paddle.zeros_like(x))


def zero_masked_inputs(mask, *tensors):
    """Each of ``tensors`` with 0 wherever ``mask == 0`` (a tuple, in order; None stays None).

    The first step of every loss in ``ppo.algos``: computing ``-A * r`` first and masking the
    product afterwards keeps the loss right but makes its gradient ``0 * inf`` or ``0 * NaN``
    (NaN) wherever a masked-out advantage, log-prob or value is not finite. ``paddle.where``
    passes no gradient to the branch it drops, so the result is finite, and equal to the
    clean inputs' result, for any junk outside the mask.
    Example: ``mask = [1, 0]``, ``x = [2, nan]`` -> ``[2, 0]``; ``d sum(out) / dx = [1, 0]``.
    Shapes: ``mask`` ``[B, T]`` (float, int or bool; non-zero = counted), each tensor ``[B, T]``.
    """
    out = []
    for x in tensors:
        out.append(None if x is None else _zero_outside(x, _float_mask(mask, x)))
    return tuple(out)


def masked_sum(x, mask, axis=None):
    """Sum of ``x`` over positions where ``mask`` is non-zero.

    Formula: ``sum_i mask_i * x_i`` (masked-out entries are zeroed first, so NaN
    or huge garbage there is ignored).
    Shapes: ``x``, ``mask`` ``[B, T]`` (any equal shapes); ``axis=None`` -> scalar,
    otherwise the reduced shape.
    Source: verl ``verl/utils/torch_functional.py::masked_sum``.
    """
    m = _float_mask(mask, x)
    return paddle.sum(_zero_outside(x, m) * m, axis=axis)


def masked_mean(x, mask, axis=None):
    """Mean of ``x`` over positions where ``mask`` is non-zero.

    Formula: ``sum(mask * x) / max(sum(mask), 1e-8)``; an empty mask gives 0
    (not NaN).
    Shapes: ``x``, ``mask`` ``[B, T]``; ``axis=None`` -> scalar, ``axis=-1`` -> ``[B]``.
    Source: verl ``masked_mean``, TRL ``trl.trainer.utils.masked_mean``.
    """
    m = _float_mask(mask, x)
    total = paddle.sum(_zero_outside(x, m) * m, axis=axis)
    count = paddle.sum(m, axis=axis)
    return total / paddle.clip(count, min=1e-8)


def masked_var(x, mask, unbiased=True):
    """Variance of ``x`` over all positions where ``mask`` is non-zero (scalar).

    Formula: ``mu = masked_mean(x)``, ``v = masked_mean((x - mu)^2)``; with
    ``unbiased=True`` Bessel's correction ``v * n / (n - 1)`` is applied where
    ``n = sum(mask)`` (for ``n <= 1`` the factor is taken as ``n`` so the result
    stays finite: 0 for a single token, 0 for an empty mask).
    Shapes: ``x``, ``mask`` ``[B, T]`` -> scalar.
    Source: verl ``masked_var`` / TRL ``masked_var`` (which raise for ``n <= 1``;
    we cannot inspect values without ``.item()``, so we return 0 instead).
    """
    m = _float_mask(mask, x)
    mean = masked_mean(x, m)
    centered = _zero_outside(x - mean, m)
    var = masked_mean(centered * centered, m)
    if unbiased:
        n = paddle.sum(m)
        var = var * n / paddle.clip(n - 1.0, min=1.0)
    return var


def masked_whiten(x, mask, shift_mean=True, eps=1e-8):
    """Whiten ``x`` with statistics taken over masked tokens only.

    Formula: ``mu = masked_mean(x, mask)``, ``var = masked_var(x, mask, unbiased=True)``,
    ``y = (x - mu) / sqrt(var + eps)``; with ``shift_mean=False`` the mean is added
    back: ``y = (x - mu) / sqrt(var + eps) + mu``.
    Positions outside the mask are returned as 0 (they never enter the statistics).
    Shapes: ``x``, ``mask`` ``[B, T]`` -> ``[B, T]``.
    Source: verl / TRL ``masked_whiten`` (which leave masked-out positions
    unspecified; here they are zeroed).
    """
    m = _float_mask(mask, x)
    return whiten_with_statistics(x, m, masked_mean(x, m), masked_var(x, m, unbiased=True), shift_mean, eps)


def whiten_with_statistics(x, mask, mean, var, shift_mean=True, eps=1e-8):
    """``masked_whiten`` with given statistics (e.g. taken over several ranks' batches).

    Formula: ``y = (x - mean) / sqrt(var + eps)`` (``+ mean`` with ``shift_mean=False``), 0
    outside the mask. Shapes: ``x``, ``mask`` ``[B, T]``, ``mean``/``var`` scalars -> ``[B, T]``.
    """
    m = _float_mask(mask, x)
    mean, var = (v if isinstance(v, paddle.Tensor) else paddle.to_tensor(v, dtype=x.dtype) for v in (mean, var))
    whitened = (x - mean) * paddle.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return _zero_outside(whitened, m)


def masked_centered_square_sum(x, mask, mean):
    """``sum_i mask_i * (x_i - mean)^2`` (scalar): one rank's part of a variance over ranks.

    Shapes: ``x``, ``mask`` ``[B, T]``, ``mean`` scalar -> scalar.
    """
    m = _float_mask(mask, x)
    centered = _zero_outside(x - mean, m)
    return paddle.sum(centered * centered * m)


def last_nonzero_index(mask):
    """Index of the last position with ``mask != 0`` in each row; -1 for an empty row.

    Formula: ``max_t (t if mask_t else -1)``; right for left padding, right padding and
    masks with holes. Example: ``[[0, 1, 1, 0], [0, 0, 0, 0]]`` -> ``[2, -1]``.
    Shapes: ``mask`` ``[B, T]`` (any leading shape) -> ``[B]`` int64.
    """
    m = mask if isinstance(mask, paddle.Tensor) else paddle.to_tensor(mask)
    m = m.astype("bool")
    pos = paddle.arange(m.shape[-1], dtype="int64").expand(m.shape)
    return paddle.max(paddle.where(m, pos, paddle.full_like(pos, -1)), axis=-1)
