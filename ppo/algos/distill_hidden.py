"""The generalised JSD of distillation (``distill.py``) from hidden states, in chunks.

Distillation compares the student's and the teacher's whole next-token distributions at every
counted (response) token: two ``[tokens, V]`` logit tensors, plus their softmaxes and the
backward's copies. As ``lm_head.py`` does for log-probs, ``gjsd_from_hidden`` gathers the
counted positions' final hidden states and runs both LM heads over ``chunk_size`` of them at a
time; a ``PyLayer`` keeps only the gathered hidden states and recomputes each chunk's logits in
backward, where the student's logit gradient has the closed form of ``distill.py``
(``dJ/dz = h - s sum h``, then ``dz/dh = W / temperature``, ``dz/dW = h / temperature``).
Memory: ``O(chunk_size * V)`` for the heads instead of ``O(tokens * V)``.

The teacher comes in one of two forms:

* ``TeacherHead(hidden, weight, transpose_y)``: its final hidden states ``[N, T, H_t]`` and LM
  head; its full distribution is recomputed per chunk (forward and backward);
* ``TeacherTopK(indices, logprobs, log_rest)``: its ``k`` most likely tokens at the counted
  positions, from ``teacher_top_k_from_hidden`` (``[M, k]``: the memory of the teacher's side
  no longer grows with the vocabulary), compared over ``k + 1`` outcomes (``distill.py``).
"""
import paddle
from paddle.autograd import PyLayer

from .distill import GKD_BETA, _check_beta, full_terms, teacher_top_k, top_k_terms
from .lm_head import _add_chunk_head_grads, _chunk_logits, _chunks, _counted_positions, _head_grads

__all__ = ["TeacherHead", "TeacherTopK", "gjsd_from_hidden", "teacher_top_k_from_hidden"]


class TeacherHead:
    """The teacher's final hidden states ``hidden [N, T, H_t]`` (the student's positions) and its
    LM head ``weight`` (``[H_t, V]``, or ``[V, H_t]`` with ``transpose_y``)."""

    def __init__(self, hidden, weight, transpose_y=False):
        self.hidden, self.weight, self.transpose_y = hidden, weight, bool(transpose_y)


class TeacherTopK:
    """The teacher's top-k tokens at the ``M`` counted positions, in their order: ``indices [M, k]``
    int64, ``logprobs [M, k]`` (normalised over the vocabulary), ``log_rest [M]`` (log of the
    remaining probability)."""

    def __init__(self, indices, logprobs, log_rest):
        self.indices, self.logprobs, self.log_rest = indices, logprobs, log_rest


def _teacher_tensors(teacher, labels, mask):
    """The three tensors the PyLayer carries for `teacher`, rows of the counted positions."""
    if isinstance(teacher, TeacherTopK):
        return teacher.indices, teacher.logprobs, teacher.log_rest
    flat_h, _, index = _counted_positions(teacher.hidden, labels, mask)
    return paddle.gather(flat_h, index), teacher.weight, paddle.zeros([1], "float32")


def _chunk_terms(z, tensors, s, e, config):
    """``(J [c], dJ/dz [c, V])`` of one chunk: student tempered logits ``z [c, V]``."""
    top_k, beta, temperature, _, _, teacher_transpose = config
    a, b, c = tensors
    if top_k:
        return top_k_terms(z, a[s:e], b[s:e].astype("float32"), c[s:e].astype("float32"), beta)
    return full_terms(z, _chunk_logits(a[s:e], b, teacher_transpose, temperature), beta)


class _ChunkedGJSD(PyLayer):
    """Per-token divergence ``[M]`` of gathered student rows ``h [M, H]``; backward recomputes
    each chunk's logits (both models') and uses the closed-form logit gradient."""

    @staticmethod
    def forward(ctx, h, weight, a, b, c, config):
        _, _, temperature, chunk_size, transpose_y, _ = config
        values = []
        with paddle.no_grad():
            for s, e in _chunks(h.shape[0], chunk_size):
                z = _chunk_logits(h[s:e], weight, transpose_y, temperature)
                values.append(_chunk_terms(z, (a, b, c), s, e, config)[0])
        ctx.save_for_backward(h, weight, a, b, c)
        ctx.config = config
        return paddle.concat(values)

    @staticmethod
    def backward(ctx, grad_out):
        h, weight, a, b, c = ctx.saved_tensor()
        config = ctx.config
        _, _, temperature, chunk_size, transpose_y, _ = config
        need_h, need_w = not h.stop_gradient, not weight.stop_gradient
        grad_h_parts, grad_w = [], None
        for s, e in _chunks(h.shape[0], chunk_size):
            z = _chunk_logits(h[s:e], weight, transpose_y, temperature)
            _, grad_z = _chunk_terms(z, (a, b, c), s, e, config)
            grad_z = grad_z * grad_out[s:e].astype("float32").unsqueeze(-1)
            grad_w = _add_chunk_head_grads(grad_z, h[s:e], weight, transpose_y, temperature, need_h, need_w,
                                           grad_h_parts, grad_w)
        grad_h, grad_w, _ = _head_grads(grad_h_parts, grad_w, weight, need_h, need_w)
        return grad_h, grad_w, None, None, None


def gjsd_from_hidden(hidden, weight, labels, mask, teacher, beta=GKD_BETA, temperature=1.0, chunk_size=1024,
                     transpose_y=False):
    """Generalised JSD (``distill.py``) of the teacher's and the student's next-token
    distributions at every counted position, from the student's final hidden states.

    Formula: ``z_t = h_t W / temperature`` for the student, the teacher's likewise (``TeacherHead``)
    or its top-k (``TeacherTopK``); per position ``J_t = JSD_beta(T_t, S_t)`` as in
    ``distill.generalized_jsd`` (``generalized_jsd_top_k`` for a top-k teacher). Positions with
    ``labels < 0`` or ``mask == 0`` are never read (garbage there changes nothing) and give 0.

    Memory: both heads run over ``chunk_size`` counted positions at a time, forward and backward
    (recomputed); ``chunk_size <= 0`` computes them in one piece with plain autograd. Gradients flow
    to ``hidden`` and ``weight`` (the student's), never to the teacher.

    Shapes: ``hidden [N, T, H]``, ``labels [N, T]`` int (``hidden[:, t]`` predicts
    ``labels[:, t]``), ``mask [N, T]`` or None -> ``[N, T]`` float32.
    Source: TRL ``GKDTrainer.generalized_jsd_loss`` (the divergence), Liger-Kernel's fused
    linear JSD (the chunking idea).
    """
    _check_beta(beta)
    out_shape = list(labels.shape)
    flat_h, _, index = _counted_positions(hidden, labels, mask)
    total = flat_h.shape[0]
    if index.shape[0] == 0:  # nothing counts: zeros that still belong to the graph
        return paddle.zeros(out_shape, "float32") + paddle.sum(flat_h[:0]).astype("float32")
    h = paddle.gather(flat_h, index)
    tensors = _teacher_tensors(teacher, labels, mask)
    top_k = isinstance(teacher, TeacherTopK)
    config = (top_k, float(beta), float(temperature), int(chunk_size) if chunk_size and chunk_size > 0 else h.shape[0],
              bool(transpose_y), bool(getattr(teacher, "transpose_y", False)))
    needs_grad = paddle.is_grad_enabled() and not (h.stop_gradient and weight.stop_gradient)
    if chunk_size is None or chunk_size <= 0 or not needs_grad:
        values = []
        for s, e in _chunks(h.shape[0], config[3]):
            z = _chunk_logits(h[s:e], weight, transpose_y, temperature)
            values.append(_chunk_terms(z, tensors, s, e, config)[0])
        value = paddle.concat(values)
    else:
        value = _ChunkedGJSD.apply(h, weight, *tensors, config)
    return paddle.scatter(paddle.zeros([total], "float32"), index, value, overwrite=True).reshape(out_shape)


def teacher_top_k_from_hidden(hidden, weight, labels, mask, k, temperature=1.0, chunk_size=1024, transpose_y=False):
    """The teacher's top-k distribution at the counted positions (``TeacherTopK``, rows in the order
    ``gjsd_from_hidden`` gathers them) and its log-prob of each label ``[N, T]`` (0 where not
    counted), ``chunk_size`` positions at a time, without gradients. Formula and shapes: as
    ``distill.teacher_top_k`` on ``h W / temperature``, ``hidden [N, T, H_t]``."""
    flat_h, flat_y, index = _counted_positions(hidden, labels, mask)
    h, y = paddle.gather(flat_h, index), paddle.gather(flat_y, index)
    parts, label_logp = [], []
    with paddle.no_grad():
        for s, e in _chunks(h.shape[0], chunk_size if chunk_size and chunk_size > 0 else max(h.shape[0], 1)):
            z = _chunk_logits(h[s:e], weight, transpose_y, temperature)
            parts.append(teacher_top_k(z, k))
            logp = z - paddle.logsumexp(z, axis=-1, keepdim=True)
            label_logp.append(paddle.take_along_axis(logp, y[s:e].unsqueeze(-1), axis=-1).squeeze(-1))
    if not parts:  # nothing counts
        empty = paddle.zeros([0, int(k)], "float32")
        return TeacherTopK(empty.astype("int64"), empty, paddle.zeros([0], "float32")), paddle.zeros(labels.shape, "float32")
    top = TeacherTopK(*(paddle.concat([p[i] for p in parts]) for i in range(3)))
    placed = paddle.scatter(paddle.zeros([flat_y.shape[0]], "float32"), index, paddle.concat(label_logp), overwrite=True)
    return top, placed.reshape(list(labels.shape))
