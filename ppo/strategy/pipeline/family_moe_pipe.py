"""The router losses of a mixture-of-experts family under pipeline parallelism, as one process
computes them (`ppo.models.families.moe.moe_losses`).

The load-balancing loss pools the routing of every MoE layer of the model, ``E * sum_e f_e *
P_e`` with ``f_e`` and ``P_e`` means over all layers' real tokens, and the z-loss is such a mean
too: both are functions of sums over layers and tokens. So the pipeline carries, next to the
hidden states, each row's running sums ``[B, 2E + 2]`` (per expert: top-k assignments and
router probabilities; then the real tokens counted and the summed squared logsumexp): the first
layer starts them at zero, each MoE layer adds its own (`router_row_sums`), a stage sends them
on (with their gradient, through the probabilities and logits), and the last stage turns the
real rows' sums into the weighted loss (`router_losses_from_sums`), which `RouterLossCriterion`
adds to the stage's own loss. The row mask is the diagonal of the additive attention mask (a
token attends to itself exactly when it is real). Carried only with ``output_router_logits``
on, in training (the plain model computes no router loss otherwise).
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


def carries_router_sums(config):
    """Whether a pipe of this config carries router sums: a mixture-of-experts family with
    ``output_router_logits`` on."""
    from ...common.model_families import FAMILIES

    family = FAMILIES.get(getattr(config, "model_type", None))
    return bool(family and family.moe and getattr(config, "output_router_logits", False))


def sums_width(config):
    return 2 * config.num_experts + 2


def real_tokens(mask):
    """``[B, T]`` float32, 1 at real tokens, from the additive mask ``[B, 1, T, T]`` (its diagonal is 0 there)."""
    return (paddle.diagonal(mask[:, 0], axis1=-2, axis2=-1) == 0).astype("float32")


def router_row_sums(logits, rows, config):
    """One MoE layer's sums per row ``[B, 2E + 2]`` from its router logits ``[B*T, E]`` and the
    real-token mask ``rows [B, T]``: top-k assignments per expert, router probabilities per
    expert, real tokens, summed ``logsumexp(logits)^2`` (as `moe._pooled` / `moe.router_z_loss`)."""
    B, T = rows.shape
    E, k = config.num_experts, config.num_experts_per_tok
    logits = logits.astype("float32")
    probs = F.softmax(logits, axis=-1)
    _, indices = paddle.topk(probs, k, axis=-1)
    r = rows.reshape([-1, 1])
    counts = (F.one_hot(indices, E).sum(axis=1) * r).reshape([B, T, E]).sum(axis=1)
    prob_sums = (probs * r).reshape([B, T, E]).sum(axis=1)
    z = (paddle.logsumexp(logits, axis=-1).square() * r[:, 0]).reshape([B, T]).sum(axis=1, keepdim=True)
    return paddle.concat([counts, prob_sums, rows.sum(axis=1, keepdim=True), z], axis=1)


def router_losses_from_sums(sums, config):
    """``(weighted loss, stats)`` of the summed rows ``[2E + 2]``, as `moe.moe_losses`:
    ``router_aux_loss_coef`` x load balancing + ``router_z_loss_coef`` x z-loss, and the
    ``moe/*`` stats (detached). No real token: 0."""
    E = config.num_experts
    counts, prob_sums = sums[:E], sums[E : 2 * E]
    total = paddle.clip(sums[2 * E], min=1.0)
    aux = ((counts / total) * (prob_sums / total)).sum() * E
    z = sums[2 * E + 1] / total
    from ...models.families.moe import weighted_router_losses

    return weighted_router_losses(aux, z, counts, config)


class RouterLossCriterion(nn.Layer):
    """A last stage's loss plus the router loss: ``output`` is ``(logits, sums [B, 2E + 2])`` in
    training (else the logits alone, passed on). `inner` may tell each micro-batch's share with
    ``router_loss_share() -> (real rows or None, weight)`` (the RL update's: stand-in rows and
    micro-batches count nothing, the weight undoes the schedule's mean); else all rows, weight 1
    (the Trainer divides every micro-batch's loss as the schedule does). The stats join the
    micro-batch's own, where `inner` records them (``record``)."""

    def __init__(self, inner, config):
        super().__init__()
        self.inner, self.config, self.pending = inner, config, {}
        record = getattr(inner, "record", None)
        if callable(record):
            inner.record = lambda stats: record({**stats, **self.pending})

    def forward(self, output, labels):
        if not isinstance(output, (tuple, list)):
            return self.inner(output, labels)
        logits, sums = output
        share = getattr(self.inner, "router_loss_share", None)
        rows, weight = share() if share is not None else (None, 1.0)
        loss, stats = router_losses_from_sums((sums if rows is None else sums[:rows]).sum(axis=0), self.config)
        self.pending = stats if weight else {}
        out = self.inner(logits, labels)
        return out + loss.astype(out.dtype) * weight if weight else out
