"""The generalised Jensen-Shannon divergence of on-policy distillation (GKD), per token.

GKD (Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes") trains a student ``S`` towards a teacher ``T`` on tokens the student
sampled, with, at every position, the divergence of the two next-token distributions

    JSD_beta(T, S) = beta * KL(T || M) + (1 - beta) * KL(S || M),   M = beta * T + (1 - beta) * S

for ``0 < beta < 1``, and at the ends (TRL's ``GKDTrainer.generalized_jsd_loss``,
trl/experimental/gkd/gkd_trainer.py, which special-cases them):

* ``beta = 0``: the forward KL ``KL(T || S) = sum_v t_v (log t_v - log s_v)`` (mode covering);
* ``beta = 1``: the reverse KL ``KL(S || T) = sum_v s_v (log s_v - log t_v)`` (mode seeking).

The ends are not the limits of the middle form, which vanishes as ``beta -> 0`` or ``1``
(``JSD_beta ~ beta KL(T || S)`` near 0, ``(1 - beta) KL(S || T)`` near 1); they are what the
paper and TRL call "forward" and "reverse". Both distributions are ``softmax(logits /
temperature)``; no ``temperature**2`` factor (as TRL).

Gradient with respect to the student's (tempered) logits ``z``, ``s = softmax(z)``: with an
outcome-wise term ``h_v = s_v * dJ/ds_v``,

    dJ/dz_u = h_u - s_u * sum_v h_v,

where ``dJ/ds_v`` is ``-t_v / s_v`` (forward KL: ``h = -t``, so ``dJ/dz = s - t``),
``log(s_v / t_v) + 1`` (reverse KL) and ``(1 - beta) log(s_v / m_v)`` (the middle form: the
terms of ``m``'s dependence on ``s`` cancel). ``bucket_divergence`` returns ``J`` and ``h``.

Top-k teacher: storing the teacher's ``[tokens, V]`` distribution costs as much as its logits;
keeping its ``k`` most likely tokens (``teacher_top_k``) costs ``[tokens, k]``. The divergence
is then taken between the two distributions coarse-grained to ``k + 1`` outcomes: the teacher's
top-k tokens one by one and "any other token" (its probability ``1 - sum`` of the k, kept as a
log for precision). This is a true divergence of distributions, never above the full one (data
processing inequality), and equal to it when the student's and the teacher's probabilities are
proportional over the other tokens (there the likelihood ratio is constant, so merging them loses
nothing) and when ``k = V``. The gradient flows to every student logit: a token outside the top-k
gets ``(s_u / S_rest) * h_rest - s_u * sum h``.
"""
import math

import paddle

GKD_BETA = 0.5
"""The default generalised-JSD interpolation (TRL `GKDConfig`'s `beta`; sft/run_distill.py's argument)."""

__all__ = [
    "GKD_BETA",
    "bucket_divergence",
    "full_terms",
    "generalized_jsd",
    "generalized_jsd_grad",
    "generalized_jsd_top_k",
    "teacher_top_k",
    "top_k_buckets",
    "top_k_grad",
    "top_k_terms",
]


def _check_beta(beta):
    if not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (0 forward KL, 1 reverse KL), got {beta}")


def bucket_divergence(student_logp, teacher_logp, beta):
    """``(J, h)``: the generalised JSD of two distributions given as log-probabilities over the
    last axis, and ``h_v = s_v dJ/ds_v`` (see the module docstring).

    Formula: ``beta = 0``: ``J = sum t (log t - log s)``, ``h = -t``; ``beta = 1``:
    ``J = sum s (log s - log t)``, ``h = s (log s - log t + 1)``; otherwise ``log m =
    logsumexp(log(1 - beta) + log s, log beta + log t)``, ``J = beta sum t (log t - log m) +
    (1 - beta) sum s (log s - log m)``, ``h = (1 - beta) s (log s - log m)``.
    Shapes: ``[..., K]`` and ``[..., K]`` (finite logs) -> ``(J [...], h [..., K])``.
    """
    _check_beta(beta)
    s, t = paddle.exp(student_logp), paddle.exp(teacher_logp)
    beta = float(beta)
    if beta == 0.0:
        return paddle.sum(t * (teacher_logp - student_logp), axis=-1), -t
    if beta == 1.0:
        diff = student_logp - teacher_logp
        return paddle.sum(s * diff, axis=-1), s * (diff + 1.0)
    log_m = paddle.logsumexp(
        paddle.stack([student_logp + math.log1p(-beta), teacher_logp + math.log(beta)]), axis=0)
    kl_t = paddle.sum(t * (teacher_logp - log_m), axis=-1)
    kl_s = paddle.sum(s * (student_logp - log_m), axis=-1)
    return beta * kl_t + (1.0 - beta) * kl_s, (1.0 - beta) * s * (student_logp - log_m)


def _tempered_log_softmax(logits, temperature):
    z = logits if temperature == 1.0 else logits / temperature
    return z - paddle.logsumexp(z, axis=-1, keepdim=True)


def generalized_jsd(student_logits, teacher_logits, beta=GKD_BETA, temperature=1.0):
    """Per-position generalised JSD between ``softmax(teacher_logits / temperature)`` and
    ``softmax(student_logits / temperature)`` over the whole vocabulary (module docstring);
    TRL's ``generalized_jsd_loss`` with ``reduction="none"`` summed over the vocabulary.

    Gradients by autograd (``generalized_jsd_grad`` gives the closed form). Shapes:
    ``[..., V]``, ``[..., V]`` -> ``[...]``.
    """
    value, _ = bucket_divergence(_tempered_log_softmax(student_logits, temperature),
                                 _tempered_log_softmax(teacher_logits, temperature), beta)
    return value


def generalized_jsd_grad(student_logits, teacher_logits, beta=GKD_BETA, temperature=1.0):
    """Closed-form ``d generalized_jsd / d student_logits`` per position:
    ``(h - s * sum h) / temperature`` with ``h`` from ``bucket_divergence`` and ``s`` the
    student's tempered softmax (module docstring). Shapes: ``[..., V]`` -> ``[..., V]``."""
    scale = 1.0 / temperature
    _, grad = full_terms(student_logits * scale, teacher_logits * scale, beta)
    return grad * scale


def full_terms(student_z, teacher_z, beta):
    """``(J [...], dJ/dstudent_z [..., V])`` of the whole-vocabulary divergence at already
    tempered logits ``student_z``, ``teacher_z [..., V]``: ``dJ/dz = h - s sum h``."""
    student_logp = student_z - paddle.logsumexp(student_z, axis=-1, keepdim=True)
    value, h = bucket_divergence(student_logp, teacher_z - paddle.logsumexp(teacher_z, axis=-1, keepdim=True), beta)
    return value, h - paddle.exp(student_logp) * paddle.sum(h, axis=-1, keepdim=True)


def teacher_top_k(teacher_logits, k, temperature=1.0):
    """The teacher's ``k`` most likely tokens at each position: ``(indices [..., k] int64,
    logprobs [..., k], log_rest [...])`` with ``logprobs`` normalised over the whole vocabulary
    and ``log_rest = log(1 - sum exp(logprobs))`` computed as the log-sum-exp of the other
    tokens' log-probs (no cancellation). ``0 < k < V``; ``softmax(logits / temperature)``."""
    vocab = teacher_logits.shape[-1]
    if not 0 < int(k) < vocab:
        raise ValueError(f"top-k needs 0 < k < vocabulary size ({vocab}), got {k}; k = 0 uses the full distribution")
    logp = _tempered_log_softmax(teacher_logits, temperature)
    values, indices = paddle.topk(logp, int(k), axis=-1)
    return indices, values, _rest_logsumexp(logp, indices)


def _rest_logsumexp(logp, indices):
    """``log sum_{v not in indices} exp(logp_v)`` per position (``logp [..., V]``)."""
    hidden = paddle.full(indices.shape, float("-inf"), dtype=logp.dtype)
    return paddle.logsumexp(paddle.put_along_axis(logp, indices, hidden, axis=-1), axis=-1)


def top_k_buckets(student_logp, indices, teacher_logprobs, teacher_log_rest):
    """The student's and the teacher's log-probabilities of the ``k + 1`` outcomes (the
    teacher's top-k tokens, then every other token together): ``([..., k + 1], [..., k + 1])``.
    ``student_logp [..., V]`` is the student's full log-softmax."""
    picked = paddle.take_along_axis(student_logp, indices, axis=-1)
    student_rest = _rest_logsumexp(student_logp, indices).unsqueeze(-1)
    teacher = paddle.concat([teacher_logprobs.astype(student_logp.dtype),
                             teacher_log_rest.astype(student_logp.dtype).unsqueeze(-1)], axis=-1)
    return paddle.concat([picked, student_rest], axis=-1), teacher


def generalized_jsd_top_k(student_logits, indices, teacher_logprobs, teacher_log_rest, beta=GKD_BETA, temperature=1.0):
    """Per-position generalised JSD against a top-k teacher (``teacher_top_k``), between the
    two distributions over the ``k + 1`` outcomes (module docstring). Gradients by autograd
    reach every student logit. Shapes: ``student_logits [..., V]``, ``indices [..., k]``,
    ``teacher_logprobs [..., k]``, ``teacher_log_rest [...]`` -> ``[...]``."""
    student, teacher = top_k_buckets(_tempered_log_softmax(student_logits, temperature), indices, teacher_logprobs,
                                     teacher_log_rest)
    value, _ = bucket_divergence(student, teacher, beta)
    return value


def top_k_grad(student_logits, indices, teacher_logprobs, teacher_log_rest, beta=GKD_BETA, temperature=1.0):
    """Closed-form ``d generalized_jsd_top_k / d student_logits``: with ``h`` of the ``k + 1``
    outcomes, ``dJ/dz_u = h_u - s_u sum h`` for a top-k token and ``(s_u / S_rest) h_rest -
    s_u sum h`` for any other, divided by ``temperature``. Shapes as ``generalized_jsd_top_k``
    -> ``[..., V]``."""
    scale = 1.0 / temperature
    _, grad = top_k_terms(student_logits * scale, indices, teacher_logprobs, teacher_log_rest, beta)
    return grad * scale


def top_k_terms(student_z, indices, teacher_logprobs, teacher_log_rest, beta):
    """``(J [...], dJ/dstudent_z [..., V])`` of the top-k divergence at already tempered student
    logits ``student_z [..., V]`` (see ``top_k_grad``)."""
    student_logp = student_z - paddle.logsumexp(student_z, axis=-1, keepdim=True)
    student, teacher = top_k_buckets(student_logp, indices, teacher_logprobs, teacher_log_rest)
    value, h = bucket_divergence(student, teacher, beta)
    k = indices.shape[-1]
    # softmax over the tokens outside the top-k (0 at the top-k): s_u / S_rest
    hidden = paddle.full(indices.shape, float("-inf"), dtype=student_z.dtype)
    rest_logits = paddle.put_along_axis(student_z, indices, hidden, axis=-1)
    rest_share = paddle.exp(rest_logits - paddle.logsumexp(rest_logits, axis=-1, keepdim=True))
    grad = rest_share * h[..., k:] - paddle.exp(student_logp) * paddle.sum(h, axis=-1, keepdim=True)
    return value, paddle.put_along_axis(grad, indices, h[..., :k], axis=-1, reduce="add")
