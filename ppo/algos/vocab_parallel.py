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

__all__ = ["vocab_parallel_token_logprobs"]


def _label_logit(z, labels, vocab_start):
    """``(picked [M], owned [M] bool, local [M] int64)``: the label's logit where this slice
    owns the label (0 elsewhere), whether it does, and its index within the slice."""
    width = z.shape[-1]
    local = labels - vocab_start
    owned = paddle.logical_and(local >= 0, local < width)
    safe = paddle.where(owned, local, paddle.zeros_like(local))
    picked = paddle.take_along_axis(z, safe.unsqueeze(-1), axis=-1).squeeze(-1)
    return paddle.where(owned, picked, paddle.zeros_like(picked)), owned, safe


class _VocabParallelStats(PyLayer):
    @staticmethod
    def forward(ctx, z, labels, vocab_start, all_reduce, with_entropy):
        with paddle.no_grad():
            m = all_reduce(paddle.max(z, axis=-1), "max")
            shifted = z - m.unsqueeze(-1)
            lse = m + paddle.log(all_reduce(paddle.sum(paddle.exp(shifted), axis=-1), "sum"))
            picked, owned, local = _label_logit(z, labels, vocab_start)
            logp = all_reduce(picked, "sum") - lse
            expect = None
            if with_entropy:
                p = paddle.exp(z - lse.unsqueeze(-1))
                expect = all_reduce(paddle.sum(p * z, axis=-1), "sum")
        ctx.save_for_backward(z, lse, owned, local)
        ctx.expect = expect
        ctx.with_entropy = with_entropy
        if with_entropy:
            return logp, lse - expect
        return logp

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy=None):
        z, lse, owned, local = ctx.saved_tensor()
        p = paddle.exp(z - lse.unsqueeze(-1))
        g = grad_logp.astype(z.dtype)
        label_grad = paddle.where(owned, g, paddle.zeros_like(g)).unsqueeze(-1)
        grad_z = paddle.put_along_axis(-p * g.unsqueeze(-1), local.unsqueeze(-1), label_grad, axis=-1, reduce="add")
        if ctx.with_entropy and grad_entropy is not None:
            grad_z = grad_z - p * (z - ctx.expect.unsqueeze(-1)) * grad_entropy.astype(z.dtype).unsqueeze(-1)
        return grad_z, None


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
