"""Token log-probs and entropy from vocabulary-parallel logits, without gathering the vocabulary.

Under tensor parallelism the LM head is column-parallel: rank ``r`` of ``R`` holds the
logits ``z_r = z[:, s_r : s_r + V_r]`` of its slice of the vocabulary. The quantities a
trainer needs per token are reductions over the whole vocabulary, so each is a local
reduction followed by an all-reduce over the model-parallel group (Megatron-LM's
``_VocabParallelCrossEntropy``; PaddleNLP's ``ParallelCrossEntropy``):

* ``m = max_r max_v z_rv``                                   (all-reduce MAX)
* ``S = sum_r sum_v exp(z_rv - m)``;  ``lse = m + log S``   (all-reduce SUM)
* ``z_y`` = the label's logit, from the rank whose slice holds ``y`` (others add 0)
* ``logp = z_y - lse``
* ``E = sum_r sum_v p_rv z_rv`` with ``p = exp(z - lse)``;  ``H = lse - E``

The backward pass needs no communication: ``d logp / d z_rv = [v == y] - p_rv`` and
``d H / d z_rv = -p_rv (z_rv - E)``, both local given the saved ``lse`` and ``E``. (The
gradient then reaches the hidden states through the LM head's input, whose
model-parallel identity all-reduces it in backward.)

The all-reduce is an argument, ``all_reduce(tensor, op) -> tensor`` with ``op`` in
``("max", "sum")``, returning the reduction over the group without writing into its input,
so this file stays free of distributed calls and a test can emulate the group.
"""
import paddle
from paddle.autograd import PyLayer

from .lm_head import _add_chunk_head_grads, _chunk_logits, _chunks, _head_grads

__all__ = ["vocab_parallel_token_logprobs", "vocab_parallel_logprobs_from_hidden"]


def _label_logit(z, labels, vocab_start):
    """``(picked [M], owned [M] bool, local [M] int64)``: the label's logit where this slice
    owns the label (0 elsewhere), whether it does, and its index within the slice."""
    width = z.shape[-1]
    local = labels - vocab_start
    owned = paddle.logical_and(local >= 0, local < width)
    safe = paddle.where(owned, local, paddle.zeros_like(local))
    picked = paddle.take_along_axis(z, safe.unsqueeze(-1), axis=-1).squeeze(-1)
    return paddle.where(owned, picked, paddle.zeros_like(picked)), owned, safe


def _parallel_stats(z, labels, vocab_start, all_reduce, with_entropy):
    """Forward statistics of one block of slice logits ``z [M, V_r]`` (no gradient):
    ``(logp [M], entropy [M] or None, lse [M], expect [M] or None, owned [M], local [M])``."""
    m = all_reduce(paddle.max(z, axis=-1), "max")
    lse = m + paddle.log(all_reduce(paddle.sum(paddle.exp(z - m.unsqueeze(-1)), axis=-1), "sum"))
    picked, owned, local = _label_logit(z, labels, vocab_start)
    logp = all_reduce(picked, "sum") - lse
    entropy = expect = None
    if with_entropy:
        p = paddle.exp(z - lse.unsqueeze(-1))
        expect = all_reduce(paddle.sum(p * z, axis=-1), "sum")
        entropy = lse - expect
    return logp, entropy, lse, expect, owned, local


def _grad_logits(z, lse, expect, owned, local, grad_logp, grad_entropy):
    """``d(sum g_lp logp + g_H H) / dz`` on this slice: ``g_lp ([v == y] - p) - g_H p (z - E)``."""
    p = paddle.exp(z - lse.unsqueeze(-1))
    g = grad_logp.astype(z.dtype)
    label_grad = paddle.where(owned, g, paddle.zeros_like(g)).unsqueeze(-1)
    grad_z = paddle.put_along_axis(-p * g.unsqueeze(-1), local.unsqueeze(-1), label_grad, axis=-1, reduce="add")
    if expect is not None and grad_entropy is not None:
        grad_z = grad_z - p * (z - expect.unsqueeze(-1)) * grad_entropy.astype(z.dtype).unsqueeze(-1)
    return grad_z


class _VocabParallelStats(PyLayer):
    @staticmethod
    def forward(ctx, z, labels, vocab_start, all_reduce, with_entropy):
        with paddle.no_grad():
            logp, entropy, lse, expect, owned, local = _parallel_stats(z, labels, vocab_start, all_reduce, with_entropy)
        ctx.save_for_backward(z, lse, owned, local)
        ctx.expect = expect
        return (logp, entropy) if with_entropy else logp

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy=None):
        z, lse, owned, local = ctx.saved_tensor()
        return _grad_logits(z, lse, ctx.expect, owned, local, grad_logp, grad_entropy), None


class _ChunkedVocabParallelHead(PyLayer):
    """``(logp [M], entropy [M])`` of gathered rows ``h [M, H]`` through a vocabulary slice of
    the LM head, ``chunk_size`` rows at a time; backward recomputes each chunk's logits from
    the saved ``lse`` / ``E`` (no communication in backward)."""

    @staticmethod
    def forward(ctx, h, weight, y, vocab_start, all_reduce, temperature, chunk_size, transpose_y, with_entropy,
                dtype="float32"):
        parts = []
        with paddle.no_grad():
            for s, e in _chunks(h.shape[0], chunk_size):
                z = _chunk_logits(h[s:e], weight, transpose_y, temperature, dtype)
                parts.append(_parallel_stats(z, y[s:e], vocab_start, all_reduce, with_entropy)[:4])
        logp = paddle.concat([q[0] for q in parts])
        lse = paddle.concat([q[2] for q in parts])
        ctx.expect = paddle.concat([q[3] for q in parts]) if with_entropy else None
        ctx.save_for_backward(h, weight, y, lse)
        ctx.config = (vocab_start, temperature, chunk_size, transpose_y, dtype)
        return (logp, paddle.concat([q[1] for q in parts])) if with_entropy else logp

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy=None):
        h, weight, y, lse = ctx.saved_tensor()
        vocab_start, temperature, chunk_size, transpose_y, dtype = ctx.config
        need_h, need_w = not h.stop_gradient, not weight.stop_gradient
        grad_h_parts, grad_w = [], None
        for s, e in _chunks(h.shape[0], chunk_size):
            h_c = h[s:e]
            z = _chunk_logits(h_c, weight, transpose_y, temperature, dtype)
            _, owned, local = _label_logit(z, y[s:e], vocab_start)
            expect = ctx.expect[s:e] if ctx.expect is not None else None
            grad_z = _grad_logits(z, lse[s:e], expect, owned, local, grad_logp[s:e],
                                  grad_entropy[s:e] if grad_entropy is not None else None)
            grad_w = _add_chunk_head_grads(grad_z, h_c, weight, transpose_y, temperature, need_h, need_w,
                                           grad_h_parts, grad_w)
        return _head_grads(grad_h_parts, grad_w, weight, need_h, need_w)


def vocab_parallel_token_logprobs(logits, labels, vocab_start, all_reduce, with_entropy=False):
    """Log-prob (and entropy) of each label under the full-vocabulary softmax, from this
    rank's slice of the logits.

    Formula (module docstring): ``logp = z_y - lse`` and ``H = lse - sum_v p_v z_v`` with
    ``lse = m + log sum_v exp(z_v - m)``, every vocabulary sum an all-reduce of a local sum.
    Hand case, ``V = 4`` split ``[0, 1 | 2, 3]``, ``z = [0, ln 3 | 0, ln 3]``: ``S = 8`` so
    ``p = [1/8, 3/8, 1/8, 3/8]``, ``logp(y=3) = ln 3 - ln 8``, ``H = ln 8 - 3/4 ln 3``.

    Shapes: ``logits [M, V_r]`` float (the slice ``[vocab_start, vocab_start + V_r)`` of the
    vocabulary, already divided by any sampling temperature), ``labels [M]`` int64 global
    token ids -> ``(logprobs [M], entropy [M] or None)`` in the dtype of ``logits``.
    ``all_reduce(tensor, op)`` with ``op`` in ``("max", "sum")`` returns the reduction over
    the model-parallel group (identity for one rank). Gradients flow to ``logits`` only.
    Every rank must call this with the same ``labels`` (the same tokens).
    """
    labels = labels.astype("int64")
    out = _VocabParallelStats.apply(logits, labels, int(vocab_start), all_reduce, bool(with_entropy))
    if with_entropy:
        return out[0], out[1]
    return out, None


def vocab_parallel_logprobs_from_hidden(
    hidden, weight, labels, mask, vocab_start, all_reduce, temperature=1.0, chunk_size=1024, transpose_y=False,
    with_entropy=False, dtype="float32",
):
    """``vocab_parallel_token_logprobs`` straight from hidden states through this rank's
    vocabulary slice of the LM head, ``chunk_size`` counted positions at a time (the
    vocabulary-parallel twin of ``token_logprobs_from_hidden``).

    Formula: ``z_t = h_t W_r / temperature`` over the slice ``W_r`` (``[H, V_r]``, or
    ``[V_r, H]`` with ``transpose_y``), then the module docstring's all-reduced
    statistics. Only positions with ``labels >= 0`` and ``mask != 0`` are read (garbage
    elsewhere changes nothing) and they give 0. Memory of order ``chunk_size * V_r`` in the
    forward and backward pass (each chunk's logits are recomputed in backward from the
    saved ``lse`` and ``E``); ``chunk_size <= 0``: all positions at once with autograd.
    Every rank of the group must pass the same ``labels`` and ``mask``.

    Shapes: ``hidden [N, T, H]``, ``labels [N, T]`` global token ids aligned with ``hidden``,
    ``mask [N, T]`` or None -> ``(logprobs [N, T], entropy [N, T] or None)`` in ``dtype``
    (float32; the training dtype when PaddleNLP's ``use_fp32_compute`` is off).
    Source: Megatron-LM ``_VocabParallelCrossEntropy``; Liger-Kernel's chunked head.
    """
    out_shape = list(labels.shape)
    flat_h = hidden.reshape([-1, hidden.shape[-1]])
    flat_y = labels.reshape([-1]).astype("int64")
    keep = flat_y >= 0
    if mask is not None:
        keep = paddle.logical_and(keep, mask.reshape([-1]) != 0)
    index = paddle.nonzero(keep).reshape([-1])
    total = flat_y.shape[0]
    if index.shape[0] == 0:  # nothing counts (on every rank alike): zeros that still belong to the graph
        zero = paddle.zeros(out_shape, dtype) + paddle.sum(flat_h[:0]).astype(dtype)
        return zero, (zero if with_entropy else None)
    h = paddle.gather(flat_h, index)
    y = paddle.gather(flat_y, index)
    if chunk_size is None or chunk_size <= 0:
        logp, entropy = vocab_parallel_token_logprobs(
            _chunk_logits(h, weight, transpose_y, temperature, dtype), y, vocab_start, all_reduce, with_entropy
        )
    else:
        out = _ChunkedVocabParallelHead.apply(
            h, weight, y, int(vocab_start), all_reduce, float(temperature), int(chunk_size), bool(transpose_y),
            bool(with_entropy), str(dtype),
        )
        logp, entropy = out if with_entropy else (out, None)

    def place(values):
        return paddle.scatter(paddle.zeros([total], dtype), index, values, overwrite=True).reshape(out_shape)

    return place(logp), (place(entropy) if with_entropy else None)
