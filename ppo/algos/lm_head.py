"""Token log-probs and entropy straight from hidden states, through the LM head in chunks.

A causal LM's logits ``z = h W`` over a vocabulary of ``V`` tokens cost ``N * T * V``
floats when computed for a whole batch (Qwen2.5: V = 151,936, so 8 x 1,024 tokens
are 5 GB in float32 before ``log_softmax`` doubles it). Only the positions that
count (response / answer tokens) need them, and each only needs two numbers:

* ``logp_t = z_t[y_t] - logsumexp(z_t)``;
* ``H_t = logsumexp(z_t) - sum_v p_tv z_tv`` (entropy, ``p_t = softmax(z_t)``),

with ``z_t = h_t W / temperature``. ``token_logprobs_from_hidden`` first gathers the
``M`` positions where the mask is on, then runs the LM head over ``chunk_size`` of
them at a time, so its memory is of order ``chunk_size * V`` in the forward AND
the backward pass: a ``PyLayer`` keeps only the gathered hidden states and
recomputes each chunk's logits in backward, where

* ``d logp_t / d z_tv = [v == y_t] - p_tv``;
* ``d H_t / d z_tv = -p_tv (z_tv - sum_u p_tu z_tu)``;
* ``d z / d h = W / temperature`` and ``d z / d W = h / temperature``.

The same idea as Liger-Kernel's fused linear cross-entropy and PaddleNLP's
``use_fused_linear_cross_entropy`` (``paddlenlp_kernel ... cut_cross_entropy``), here
in plain Paddle and with entropy. A fused kernel can later sit behind the same
function.
"""
import paddle
from paddle.autograd import PyLayer

__all__ = ["token_logprobs_from_hidden"]


def _chunk_logits(h, weight, transpose_y, temperature, dtype="float32"):
    """Logits ``[c, V]`` in ``dtype`` (float32 unless PaddleNLP's ``use_fp32_compute`` is off) of
    hidden rows ``h [c, H]`` divided by ``temperature``.

    ``weight`` is ``[H, V]`` (``transpose_y=False``) or ``[V, H]`` (``transpose_y=True``,
    a head tied to the input embedding)."""
    z = paddle.matmul(h, weight, transpose_y=transpose_y).astype(dtype)
    return z if temperature == 1.0 else z / temperature


def _chunk_stats(z, y, with_entropy, kernels=None):
    """``(logp [c], entropy [c] or None, lse [c])`` of float32 logits ``z [c, V]`` at labels ``y [c]``
    (through ``kernels.stats`` when given and ``kernels.accepts(z)``)."""
    if kernels is not None and kernels.accepts(z):
        return kernels.stats(z, y, with_entropy)
    lse = paddle.logsumexp(z, axis=-1)
    picked = paddle.take_along_axis(z, y.unsqueeze(-1), axis=-1).squeeze(-1)
    entropy = None
    if with_entropy:
        p = paddle.exp(z - lse.unsqueeze(-1))
        entropy = lse - paddle.sum(p * z, axis=-1)
    return picked - lse, entropy, lse


def _chunks(total, chunk_size):
    return [(s, min(s + chunk_size, total)) for s in range(0, total, chunk_size)]


class _ChunkedLMHeadLogprobs(PyLayer):
    """Chunked ``(logp [M], entropy [M])`` of gathered rows ``h [M, H]``; backward recomputes
    each chunk's logits (see the module docstring for the gradients)."""

    @staticmethod
    def forward(ctx, h, weight, y, temperature, chunk_size, transpose_y, with_entropy, kernels=None, dtype="float32"):
        logps, entropies = [], []
        with paddle.no_grad():
            for s, e in _chunks(h.shape[0], chunk_size):
                lp, ent, _ = _chunk_stats(_chunk_logits(h[s:e], weight, transpose_y, temperature, dtype), y[s:e],
                                          with_entropy, kernels)
                logps.append(lp)
                entropies.append(ent)
        ctx.save_for_backward(h, weight, y)
        ctx.config = (temperature, chunk_size, transpose_y, with_entropy, kernels, dtype)
        logp = paddle.concat(logps)
        if with_entropy:
            return logp, paddle.concat(entropies)
        return logp

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy=None):
        h, weight, y = ctx.saved_tensor()
        temperature, chunk_size, transpose_y, with_entropy, kernels, dtype = ctx.config
        need_h, need_w = not h.stop_gradient, not weight.stop_gradient
        grad_h_parts, grad_w = [], None
        for s, e in _chunks(h.shape[0], chunk_size):
            h_c = h[s:e]
            z = _chunk_logits(h_c, weight, transpose_y, temperature, dtype)
            if kernels is not None and kernels.accepts(z):
                g_ent = grad_entropy[s:e].astype("float32") if with_entropy and grad_entropy is not None else None
                grad_z = kernels.grad_z(z, y[s:e], grad_logp[s:e].astype("float32"), g_ent)
                grad_w = _add_chunk_head_grads(grad_z, h_c, weight, transpose_y, temperature, need_h, need_w,
                                               grad_h_parts, grad_w)
                continue
            lse = paddle.logsumexp(z, axis=-1, keepdim=True)
            p = paddle.exp(z - lse)
            g_lp = grad_logp[s:e].astype(dtype).unsqueeze(-1)
            # (onehot(y) - p) * g, with the label term added in place of a one-hot matrix
            grad_z = paddle.put_along_axis(-p * g_lp, y[s:e].unsqueeze(-1), g_lp, axis=-1, reduce="add")
            if with_entropy and grad_entropy is not None:
                mean_z = paddle.sum(p * z, axis=-1, keepdim=True)
                grad_z = grad_z - p * (z - mean_z) * grad_entropy[s:e].astype(dtype).unsqueeze(-1)
            grad_w = _add_chunk_head_grads(grad_z, h_c, weight, transpose_y, temperature, need_h, need_w,
                                           grad_h_parts, grad_w)
        return _head_grads(grad_h_parts, grad_w, weight, need_h, need_w)


def _add_chunk_head_grads(grad_z, h_c, weight, transpose_y, temperature, need_h, need_w, grad_h_parts, grad_w):
    """Back through ``z = h W / temperature`` for one chunk: ``grad_z [c, V]`` (w.r.t. the
    tempered logits) gives the chunk's hidden-state gradient (appended to ``grad_h_parts``)
    and is added to the running float32 head gradient ``grad_w`` (returned; None at first)."""
    if temperature != 1.0:
        grad_z = grad_z / temperature
    if need_h:
        grad_h_parts.append(paddle.matmul(grad_z.astype(h_c.dtype), weight, transpose_y=not transpose_y))
    if need_w:  # accumulated in float32 with addmm: one [V, H] buffer besides the running sum
        h32 = h_c.astype("float32")
        # weight [V, H]: grad = grad_z^T h; weight [H, V]: grad = h^T grad_z
        grad_z = grad_z.astype("float32")
        x, y_ = (grad_z.t(), h32) if transpose_y else (h32.t(), grad_z)
        grad_w = paddle.matmul(x, y_) if grad_w is None else paddle.addmm(grad_w, x, y_)
    return grad_w


def _head_grads(grad_h_parts, grad_w, weight, need_h, need_w):
    """The PyLayer backward's return value ``(grad_h, grad_w, None)`` from the chunks' parts."""
    grad_h = paddle.concat(grad_h_parts) if need_h else None
    if need_w and grad_w.dtype != weight.dtype:
        grad_w = grad_w.astype(weight.dtype)
    return grad_h, (grad_w if need_w else None), None


def _counted_positions(hidden, labels, mask):
    """`hidden` as `[M_all, H]`, `labels` as `[M_all]` int64, and the indices `[M]` of the
    positions that count (label >= 0 and, with a mask, mask != 0)."""
    flat_h = hidden.reshape([-1, hidden.shape[-1]])
    flat_y = labels.reshape([-1]).astype("int64")
    keep = flat_y >= 0
    if mask is not None:
        keep = paddle.logical_and(keep, mask.reshape([-1]) != 0)
    return flat_h, flat_y, paddle.nonzero(keep).reshape([-1])


def token_logprobs_from_hidden(
    hidden, lm_head_weight, labels, mask=None, temperature=1.0, chunk_size=1024, transpose_y=False, with_entropy=False,
    kernels=None, dtype="float32",
):
    """Log-prob (and entropy) of each label token, from hidden states through the LM head.

    Formula: ``z_t = h_t W / temperature`` (``W`` given as ``[H, V]``, or as ``[V, H]``
    with ``transpose_y=True`` for a head tied to the embedding), ``logp_t = z_t[y_t] -
    logsumexp(z_t)`` and ``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_tv``, in ``dtype``
    (float32; the training dtype when PaddleNLP's ``use_fp32_compute`` is off) whatever the
    dtype of ``hidden``; the head's gradient is accumulated in float32 either way. Positions
    with ``mask == 0`` or ``labels < 0`` are never read (garbage, even NaN, there changes nothing) and give 0. Equal to
    ``token_logprobs(h W, labels, temperature)`` and ``entropy_from_logits(h W / temperature)``
    on full logits.

    Memory: only the ``M`` positions that count are gathered; the head runs over
    ``chunk_size`` of them at a time, forward and backward (recomputed per chunk), so
    the LM-head part needs ``O(chunk_size * V)`` instead of ``O(N * T * V)``.
    ``chunk_size <= 0`` computes the ``M`` positions in one piece with plain autograd.
    Gradients flow to ``hidden`` and ``lm_head_weight`` (where they require them).

    Shapes: ``hidden [N, T, H]`` (any leading shape), ``labels [N, T]`` int (already
    aligned: ``hidden[:, t]`` predicts ``labels[:, t]``), ``mask [N, T]`` or None ->
    ``(logprobs [N, T], entropy [N, T] or None)`` in ``dtype``.
    ``kernels``: optional fused per-chunk kernels (``accepts(z)``, ``stats(z, y, with_entropy)``
    -> ``(logp, entropy or None, lse)``, ``grad_z(z, y, g_logp, g_entropy or None)`` -> ``dz``,
    may overwrite ``z``) for the chunked paths; this module's Paddle code is their twin.
    Source: Liger-Kernel ``fused_linear_cross_entropy``; verl ``logprobs_from_logits``
    and ``entropy_from_logits`` for the two quantities.
    """
    out_shape = list(labels.shape)
    flat_h, flat_y, index = _counted_positions(hidden, labels, mask)
    total = flat_y.shape[0]
    if index.shape[0] == 0:  # nothing counts: zeros that still belong to the graph
        zero = paddle.zeros(out_shape, dtype) + paddle.sum(flat_h[:0]).astype(dtype)
        return zero, (zero if with_entropy else None)
    h = paddle.gather(flat_h, index)
    y = paddle.gather(flat_y, index)
    needs_grad = paddle.is_grad_enabled() and not (h.stop_gradient and lm_head_weight.stop_gradient)
    if chunk_size is None or chunk_size <= 0:
        logp, entropy, _ = _chunk_stats(_chunk_logits(h, lm_head_weight, transpose_y, temperature, dtype), y, with_entropy)
    elif not needs_grad:
        parts = [_chunk_stats(_chunk_logits(h[s:e], lm_head_weight, transpose_y, temperature, dtype), y[s:e],
                              with_entropy, kernels) for s, e in _chunks(h.shape[0], chunk_size)]
        logp = paddle.concat([p[0] for p in parts])
        entropy = paddle.concat([p[1] for p in parts]) if with_entropy else None
    else:
        out = _ChunkedLMHeadLogprobs.apply(
            h, lm_head_weight, y, float(temperature), int(chunk_size), bool(transpose_y), bool(with_entropy), kernels,
            str(dtype),
        )
        logp, entropy = out if with_entropy else (out, None)

    def place(values):
        return paddle.scatter(paddle.zeros([total], dtype), index, values, overwrite=True).reshape(out_shape)

    return place(logp), (place(entropy) if with_entropy else None)
