"""The rollout engine's routed mixture-of-experts MLP (a layer whose ``mlp`` is
`ppo.models.families.moe.SparseMoeBlock`).

The same routing as the training forward (`moe.route`: float32 softmax, top-k chosen with the
block's selection bias if it has one, optional renormalisation) and the same gather / scatter by
expert as `moe.dispatch`, grouped by one sort (`grouped_dispatch`): each expert's SwiGLU runs
once per step on the rows routed to it, never densely over all experts; the block's shared
experts (ERNIE 4.5's; Qwen2-MoE's times its sigmoid gate) run on every row as one SwiGLU. The routed
experts of a step (decode or prefill) are one op, `ops.moe_experts`: the compiled
`rollout_moe_experts` for CPU float32, else `moe_experts` here, its pure-Paddle twin. Expert
matrices are kept [in, out] (gate and up fused into [H, 2I]) in either engine layout; a "cols"
decode step transposes its activations ``[H, B]`` to rows for this block and back.
"""
from dataclasses import dataclass
from typing import List, Optional

import paddle
import paddle.nn.functional as F

from ..models.families.moe import route, router_logits


@dataclass
class MoeWeights:
    router: paddle.Tensor  # [H, E]
    gate_up: List[paddle.Tensor]  # per expert [H, 2I]
    down: List[paddle.Tensor]  # per expert [I, H]
    top_k: int
    norm_topk_prob: bool
    selection_bias: Optional[paddle.Tensor] = None  # [E] float32, for choosing experts only
    norm_min: float = 0.0
    shared_gate_up: Optional[paddle.Tensor] = None  # [H, 2S] of the shared experts
    shared_down: Optional[paddle.Tensor] = None  # [S, H]
    shared_gate: Optional[paddle.Tensor] = None  # [H, 1]: the shared output times sigmoid(x @ it)
    router_float32: bool = False


def is_moe_mlp(mlp):
    return hasattr(mlp, "experts") and hasattr(mlp, "gate")


def moe_weights(mlp, cast, weight_of):
    """`MoeWeights` of a sparse block; `cast` moves a tensor to the engine's dtype,
    `weight_of(linear)` is the whole weight a linear multiplies by (an active LoRA delta added,
    tensor-parallel slices gathered: `ppo.rollout.weights`)."""
    gate_up = [cast(paddle.concat([weight_of(e.gate_proj), weight_of(e.up_proj)], axis=1))
               for e in mlp.experts]
    down = [cast(weight_of(e.down_proj)) for e in mlp.experts]
    shared, gate = mlp.shared_layers()
    shared_gate_up = shared_down = None
    if shared is not None:
        shared_gate_up = cast(paddle.concat([weight_of(shared.gate_proj), weight_of(shared.up_proj)], axis=1))
        shared_down = cast(weight_of(shared.down_proj))
    bias = mlp.selection_bias()
    return MoeWeights(cast(weight_of(mlp.gate)), gate_up, down, mlp.top_k, mlp.norm_topk_prob,
                      None if bias is None else bias.astype("float32"), float(mlp.norm_min), shared_gate_up, shared_down,
                      None if gate is None else cast(weight_of(gate)), mlp.router_float32)


class RoutingRecord:
    """The experts each token of one `generate` call was routed to (routing replay, R3): per MoE
    layer ``[B, Tp + N, k]`` int64, -1 where the engine never ran the token (the last sampled
    token, columns past a row's end)."""

    def __init__(self, batch, length):
        self.batch, self.length, self.layers = batch, length, {}

    def add(self, layer, indices, t0, shape, rows=None):
        """Record ``indices [N, k]`` of a prefill (``shape [B, T, H]``, columns t0..t0+T) or a
        decode step (``shape [b, H]``, column t0 of the original rows `rows [b]`: the engine
        drops finished rows as it goes)."""
        k = indices.shape[1]
        if layer not in self.layers:
            self.layers[layer] = paddle.full([self.batch, self.length, k], -1, dtype="int64")
        record = self.layers[layer]
        if len(shape) == 3:
            record[:, t0:t0 + shape[1]] = indices.reshape([shape[0], shape[1], k])
        else:
            record[:, t0] = paddle.scatter(record[:, t0], rows, indices)

    def result(self, length):
        """Per MoE layer (in layer order) ``[B, length, k]``."""
        return [self.layers[i][:, :length] for i in sorted(self.layers)]


def grouped_dispatch(x, weights, indices, experts):
    """`ppo.models.families.moe.dispatch` with the rows grouped by expert in one stable sort: the
    same rows per expert in the same order, added to each output row in the same (expert) order,
    so the same numbers, with a handful of ops per step instead of about ten per expert.
    ``x [N, H]``, ``weights [N, k]``, ``indices [N, k]`` -> ``[N, H]``."""
    top_k = indices.shape[1]
    flat = indices.reshape([-1])
    counts = paddle.bincount(flat, minlength=len(experts)).numpy()
    order = paddle.argsort(flat, stable=True)  # slots grouped by expert, slot order within
    rows = order // top_k
    grouped = paddle.gather(x, rows)
    pieces, start = [], 0
    for e, count in enumerate(counts):
        if count:
            pieces.append(experts[e](grouped[start:start + int(count)]))
            start += int(count)
    scale = paddle.gather(weights.reshape([-1]).astype(x.dtype), order).unsqueeze(-1)
    return paddle.index_add(paddle.zeros_like(x), rows, 0, paddle.concat(pieces) * scale)


def _swiglu_expert(swiglu, gate_up, down):
    return lambda h: paddle.matmul(swiglu(paddle.matmul(h, gate_up), None, False), down)


def moe_experts(x, weights, indices, gate_up, down):
    """The routed experts' weighted sum for ``x [N, H]``, ``weights [N, k]``, ``indices [N, k]``
    and per expert ``gate_up [H, 2I]``, ``down [I, H]`` -> ``[N, H]``: `grouped_dispatch` of
    SwiGLU experts in pure Paddle, the twin of the compiled ``rollout_moe_experts``."""
    return grouped_dispatch(x, weights, indices, [_swiglu_expert(F.swiglu, g, d) for g, d in zip(gate_up, down)])


def routed_mlp(ops, x, weights, cols, record=None, layer=0, t0=0, batch_rows=None):
    """The block's output for normed activations ``x``: ``[B, T, H]`` / ``[B, H]`` rows, or
    ``[H, B]`` with `cols`; the same shape back. `record`: a `RoutingRecord` that keeps the
    chosen experts of layer `layer` at column `t0` (of the original `batch_rows` in a decode step)."""
    rows = x.transpose([1, 0]) if cols else x
    shape = rows.shape
    flat = rows.reshape([-1, shape[-1]])
    logits = router_logits(flat, weights.router, weights.router_float32)
    probs_w, indices = route(logits, weights.top_k, weights.norm_topk_prob,
                             selection_bias=weights.selection_bias, norm_min=weights.norm_min)
    if record is not None:
        record.add(layer, indices, t0, shape, batch_rows)

    out = ops.moe_experts(flat, probs_w, indices, weights.gate_up, weights.down)  # every routed expert, one op
    if weights.shared_down is not None:
        shared = _swiglu_expert(ops.swiglu, weights.shared_gate_up, weights.shared_down)(flat)
        if weights.shared_gate is not None:
            shared = F.sigmoid(paddle.matmul(flat, weights.shared_gate)) * shared
        out = out + shared
    out = out.reshape(shape)
    return out.transpose([1, 0]).contiguous() if cols else out
