"""A sparse mixture-of-experts MLP block shared by the MoE families, its auxiliary losses and stats.

The block is transformers' `Qwen3MoeSparseMoeBlock` (and Mixtral's / Qwen2-MoE's routed part):
a router ``gate`` (linear ``[H, E]``, no bias), softmax over the ``E`` experts in float32, the
``num_experts_per_tok`` (k) largest probabilities as each token's experts, renormalised to sum
to 1 with ``norm_topk_prob``, and each expert a SwiGLU MLP of width ``moe_intermediate_size``
computed only on the tokens routed to it (gathered by expert, weighted, scattered back with
``index_add``). There is no capacity limit: no token is dropped. Under expert parallelism
(`ppo.strategy.expert`) the block holds only its rank's experts and its ``expert_parallel``
hook exchanges the tokens with the other ranks.

Routing replay (R3, Ma et al. 2025): ``forward(x, expert_indices=[N, k])`` uses those experts
instead of its own top-k; their gate weights still come from the current router's softmax
(gathered at the given indices, then renormalised as above), so the router keeps its gradient.
The block returns the indices it used, so a rollout can record them, and counts while it
replays how many tokens its router's own top-k set equals the given one (`replay_agreement_counts`,
read and reset by `ppo.models.routing_replay.take_replay_agreement`).

Losses, over the router logits of every MoE layer of one forward (a list of ``[N, E]``):

* `load_balancing_loss`: transformers' ``load_balancing_loss_func`` (Switch Transformer,
  Fedus et al. 2021, eqs. 4-6): ``E * sum_e f_e * P_e`` with ``f_e`` the share of the top-k
  assignments that went to expert e (summing to k over experts) and ``P_e`` its mean router
  probability, tokens of all layers pooled, padding excluded by ``mask``. Weighted by
  ``router_aux_loss_coef`` when ``output_router_logits`` is on.
* `router_z_loss`: ST-MoE's (Zoph et al. 2022) ``mean(logsumexp(logits)^2)``, PaddleNLP's
  ``_cal_z_loss``; weighted by ``router_z_loss_coef`` (transformers' SwitchTransformers name).
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from .decoder import MLP


def route(logits, top_k, norm_topk_prob, expert_indices=None, selection_bias=None, norm_min=0.0):
    """``(weights [N, k] float32, indices [N, k] int64)`` of router ``logits [N, E]``: the top-k
    softmax probabilities, or the probabilities at the given ``expert_indices`` (replay; a -1
    entry keeps the router's own choice); renormalised over the k with `norm_topk_prob`
    (divided by ``max(sum, norm_min)``). ``selection_bias [E]`` (ERNIE 4.5's
    ``e_score_correction_bias``) is added to the probabilities for choosing the experts only:
    the weights stay the unbiased probabilities."""
    probs = F.softmax(logits.astype("float32"), axis=-1)
    if selection_bias is None:
        weights, indices = paddle.topk(probs, top_k, axis=-1)
    else:
        indices = paddle.topk(probs + selection_bias.astype("float32"), top_k, axis=-1)[1]
        weights = paddle.take_along_axis(probs, indices, axis=-1)
    if expert_indices is not None:  # -1: not recorded, the router's own choice
        given = expert_indices.astype("int64")
        indices = paddle.where(given >= 0, given, indices)
        weights = paddle.take_along_axis(probs, indices, axis=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdim=True).clip(min=norm_min)
    return weights, indices


def replay_agreement_counts(logits, top_k, expert_indices, selection_bias=None):
    """``(same, recorded)`` float32 scalars of a replayed routing: of the tokens whose ``k``
    entries of ``expert_indices [N, k]`` are all given (>= 0), how many the router's own choice
    from ``logits [N, E]`` (top-k of the probabilities plus ``selection_bias [E]`` where given, as
    `route` selects) is the same set of experts, and how many there are."""
    with paddle.no_grad():
        scores = F.softmax(logits.astype("float32"), axis=-1)
        scores = scores if selection_bias is None else scores + selection_bias.astype("float32")
        own = paddle.sort(paddle.topk(scores, top_k, axis=-1)[1], axis=-1)
        given = paddle.sort(expert_indices.astype("int64"), axis=-1)
        recorded = (given >= 0).all(axis=-1)
        same = paddle.logical_and((own == given).all(axis=-1), recorded)
        return same.astype("float32").sum(), recorded.astype("float32").sum()


def router_logits(x, weight, in_float32=False):
    """``x [N, H] @ weight [H, E]``, in float32 when `in_float32` (``[N, E]``)."""
    if in_float32:
        return paddle.matmul(x.astype("float32"), weight.astype("float32"))
    return paddle.matmul(x, weight)


def dispatch(x, weights, indices, experts):
    """``sum_j weights[:, j] * experts[indices[:, j]](x)`` for ``x [N, H]``, each expert run
    once on the rows routed to it (none on an expert no token chose). Returns ``[N, H]``."""
    top_k = indices.shape[1]
    flat = indices.reshape([-1])
    counts = paddle.bincount(flat, minlength=len(experts)).numpy()
    flat_weights = weights.reshape([-1]).astype(x.dtype)
    out = paddle.zeros_like(x)
    for e, count in enumerate(counts):
        if count == 0:
            continue
        slots = paddle.nonzero(flat == e).reshape([-1])  # positions in [N * k]
        rows = slots // top_k
        y = experts[e](paddle.gather(x, rows)) * paddle.gather(flat_weights, slots).unsqueeze(-1)
        out = paddle.index_add(out, rows, 0, y)
    return out


class SparseMoeBlock(nn.Layer):
    """Router ``gate`` and ``num_experts`` SwiGLU ``experts`` (see the module docstring).
    Config fields: ``hidden_size``, ``num_experts``, ``num_experts_per_tok``,
    ``moe_intermediate_size``, ``norm_topk_prob``. A family adds experts every token runs
    (`shared_layers`) and a selection bias (`selection_bias`) in a subclass."""

    norm_min = 0.0
    router_float32 = False  # the router's matmul in float32 whatever the model's dtype (ERNIE 4.5's)
    shared_name = None  # the attribute of the shared experts (`shared_layers`), if the family has them

    @staticmethod
    def shared_width(config):
        """The shared experts' SwiGLU width (0: none)."""
        return 0

    def __init__(self, config):
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, self.num_experts, bias_attr=False)
        self.experts = nn.LayerList([MLP(config, config.moe_intermediate_size) for _ in range(self.num_experts)])
        self.replay_counts = None  # (same, recorded) summed over the replayed forwards since the last take
        self.expert_parallel = None  # set by ppo.strategy.expert: this rank's experts, tokens exchanged

    def selection_bias(self):
        """``[E]`` added to the router's probabilities to choose experts (not to weigh them), or None."""
        return None

    def shared_layers(self):
        """``(shared MLP, its gate)``: the experts every token runs, added to the routed sum
        (times ``sigmoid(gate(x))`` when a gate ``[H, 1]`` is given, Qwen2-MoE's); ``(None, None)``."""
        return None, None

    def shared_output(self, x):
        """``[N, H]`` of the shared experts on ``x [N, H]`` (see `shared_layers`), or None."""
        mlp, gate = self.shared_layers()
        if mlp is None:
            return None
        out = mlp(x)
        return out if gate is None else F.sigmoid(gate(x)) * out

    def forward(self, x, expert_indices=None):
        """x ``[B, T, H]`` -> ``(out [B, T, H], router_logits [B*T, E], indices [B*T, k])``;
        ``expert_indices [B*T, k]`` replays a recorded routing (and adds to `replay_counts`)."""
        B, T, H = x.shape
        flat = x.reshape([-1, H])
        logits = router_logits(flat, self.gate.weight, self.router_float32)
        weights, indices = route(logits, self.top_k, self.norm_topk_prob, expert_indices, self.selection_bias(),
                                 self.norm_min)
        if expert_indices is not None:
            counts = replay_agreement_counts(logits, self.top_k, expert_indices, self.selection_bias())
            self.replay_counts = counts if self.replay_counts is None else tuple(
                a + b for a, b in zip(self.replay_counts, counts))
        run = dispatch if self.expert_parallel is None else self.expert_parallel
        out = run(flat, weights, indices, self.experts)
        shared = self.shared_output(flat)
        out = out if shared is None else out + shared
        return out.reshape([B, T, H]), logits, indices


def _pooled(router_logits, top_k, mask):
    """``(probs [L*N, E] float32, top-k indices [L*N, k], row weights [L*N])`` of the layers' logits."""
    logits = paddle.concat([g.astype("float32") for g in router_logits], axis=0)
    probs = F.softmax(logits, axis=-1)
    _, indices = paddle.topk(probs, top_k, axis=-1)
    if mask is None:
        rows = paddle.ones([logits.shape[0]], dtype="float32")
    else:
        rows = paddle.concat([mask.reshape([-1]).astype("float32")] * len(router_logits))
    return probs, indices, rows


def expert_token_counts(router_logits, num_experts, top_k, mask=None):
    """``[E]`` float32: top-k assignments per expert over all layers (padding excluded)."""
    _, indices, rows = _pooled(router_logits, top_k, mask)
    one_hot = F.one_hot(indices, num_experts).sum(axis=1)  # [L*N, E]
    return (one_hot * rows.unsqueeze(-1)).sum(axis=0)


def load_balancing_loss(router_logits, num_experts, top_k, mask=None):
    """transformers' ``load_balancing_loss_func`` (see the module docstring): scalar float32.
    ``router_logits``: list of ``[N, E]`` (one per MoE layer); ``mask [N]`` (1 real, 0 padding)."""
    probs, indices, rows = _pooled(router_logits, top_k, mask)
    total = rows.sum()
    tokens_per_expert = (F.one_hot(indices, num_experts).sum(axis=1) * rows.unsqueeze(-1)).sum(axis=0) / total
    prob_per_expert = (probs * rows.unsqueeze(-1)).sum(axis=0) / total
    return (tokens_per_expert * prob_per_expert).sum() * num_experts


def router_z_loss(router_logits, mask=None):
    """``mean(logsumexp(logits)^2)`` over the (real) tokens of every layer: scalar float32."""
    logits = paddle.concat([g.astype("float32") for g in router_logits], axis=0)
    z = paddle.logsumexp(logits, axis=-1).square()
    if mask is None:
        return z.mean()
    rows = paddle.concat([mask.reshape([-1]).astype("float32")] * len(router_logits))
    return (z * rows).sum() / rows.sum()


def moe_losses(router_logits, config, mask=None):
    """``(weighted auxiliary loss, stats)`` of one forward: ``router_aux_loss_coef`` x
    `load_balancing_loss` + ``router_z_loss_coef`` x `router_z_loss`, and the per-step stats
    ``moe/aux_loss`` (unweighted), ``moe/z_loss``, ``moe/expert_load_max_over_mean`` (the
    busiest expert's assignments over the mean, 1.0 when balanced) and ``moe/dropped_tokens``
    (0: the block has no capacity limit). Stats are detached tensors."""
    aux = load_balancing_loss(router_logits, config.num_experts, config.num_experts_per_tok, mask)
    z = router_z_loss(router_logits, mask)
    counts = expert_token_counts(router_logits, config.num_experts, config.num_experts_per_tok, mask)
    return weighted_router_losses(aux, z, counts, config)


def weighted_router_losses(aux, z, counts, config):
    """``(router_aux_loss_coef x aux + router_z_loss_coef x z, moe/* stats)`` from the unweighted
    load-balancing loss ``aux``, z-loss ``z`` (scalars) and per-expert assignments ``counts [E]``."""
    loss = aux * float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)
    z_coef = float(getattr(config, "router_z_loss_coef", 0.0) or 0.0)
    if z_coef:
        loss = loss + z * z_coef
    stats = {"moe/aux_loss": aux.detach(), "moe/z_loss": z.detach(),
             "moe/expert_load_max_over_mean": (counts.max() / counts.mean().clip(min=1e-9)).detach(),
             "moe/dropped_tokens": paddle.zeros([], dtype="float32")}
    return loss, stats


def take_aux_loss(lm):
    """``(weighted auxiliary loss or None, stats)`` kept by the last forward of an MoE causal LM
    `lm` (unwrapped: `ppo.models.basics.unwrap_model`) with ``output_router_logits``; handed out
    once. A trainer that computes its loss from the logits adds the loss to its own."""
    aux = getattr(lm, "moe_aux_loss", None)
    if aux is None:
        return None, {}
    lm.moe_aux_loss = None
    if aux.stop_gradient:  # a forward without gradients (evaluation, old log-probs): nothing to train
        return None, {}
    return aux, dict(getattr(lm, "moe_stats", {}))


class StatsMean:
    """Running means of the ``moe/*`` stats of the micro-batches since the last log."""

    def __init__(self):
        self.sums, self.count = {}, 0

    def add(self, stats):
        if stats:
            for key, value in stats.items():
                self.sums[key] = self.sums.get(key, 0.0) + float(value)
            self.count += 1

    def take(self):
        """The means (empty when nothing was added); resets."""
        out = {key: value / self.count for key, value in self.sums.items()} if self.count else {}
        self.sums, self.count = {}, 0
        return out
