"""Routing replay (R3: Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning
Training and Inference Routers"): the experts the rollout routed each token to are data of the
sample, and the training forward of the same tokens uses them instead of its own top-k.

One experience holds them as ``routing [N, T, L, k]`` int32 (rows, the columns of its
``sequences``, the model's mixture-of-experts layers in order, the k experts), the layout of
verl's router replay (``[bs, max_seq_len, layer_num, topk]``, `verl/utils/megatron/
router_replay_utils.py`); -1 where nothing is replayed (padding, each row's last token, which
the engine never ran as a live row), which the model's block routes by its own router. A forward replays them
through the family's hook, ``model(..., moe_expert_indices=[per MoE layer [B*T, k]])``
(`ppo.models.families.moe.SparseMoeBlock`), which counts on the way how many replayed tokens
its router would have sent to the same experts (`take_replay_agreement`).
"""
import numpy as np
import paddle

from .causal_lm import last_token_index

ROUTING_DTYPE = "int32"


def rollout_routing(expert_indices, attention_mask):
    """``[B, T, L, k]`` int32 of the engine's per-layer ``expert_indices`` (each ``[B, T, k]``,
    `ppo.rollout.params.RolloutOutput`), -1 where ``attention_mask [B, T]`` is 0 and at each
    row's last real token: the engine samples it and stops (a row that ends on its stop token
    runs it once more as a finished row, whose attention is skipped, so the experts recorded
    there are not the token's); its output predicts nothing the losses read."""
    stacked = paddle.stack([e.astype(ROUTING_DTYPE) for e in expert_indices], axis=2)
    columns = paddle.arange(attention_mask.shape[1], dtype="int64").unsqueeze(0)
    last = (columns == last_token_index(attention_mask).unsqueeze(1))
    keep = paddle.logical_and(attention_mask != 0, paddle.logical_not(last)).unsqueeze(-1).unsqueeze(-1)
    return paddle.where(keep, stacked, paddle.full_like(stacked, -1))


def replay_kwargs(routing):
    """The forward's keyword arguments replaying ``routing [n, T, L, k]`` (for a forward over
    ``[n, T]`` tokens): ``{"moe_expert_indices": [L x [n*T, k] int64]}``; ``{}`` for None."""
    if routing is None:
        return {}
    k = routing.shape[-1]
    return {"moe_expert_indices": [routing[:, :, i].reshape([-1, k]).astype("int64") for i in range(routing.shape[2])]}


def packed_routing(packed, routing):
    """``routing [N, T, L, k]`` in the layout of `ppo.models.unpadded.PackedRows` `packed`:
    ``[R, C, L, k]``, -1 on the packed rows' padding."""
    values = routing.numpy()
    R, C = packed.input_ids.shape
    out = np.full([R * C, *values.shape[2:]], -1, dtype=values.dtype)
    out[packed.index[packed.valid.reshape(-1)]] = values[packed.valid]
    return paddle.to_tensor(out.reshape([R, C, *values.shape[2:]]))


def pad_routing(routing, left, right, prompt_len):
    """``routing [N, T, L, k]`` with `left` columns of -1 before the prompt and `right` after
    the response (the prompt is its first `prompt_len` columns)."""
    def fill(n):
        return paddle.full([routing.shape[0], n, *routing.shape[2:]], -1, routing.dtype)

    parts = ([fill(left)] if left else []) + [routing[:, :prompt_len], routing[:, prompt_len:]] + ([fill(right)] if right else [])
    return paddle.concat(parts, axis=1)


def take_replay_agreement(model):
    """``(same, recorded)`` floats summed over `model`'s mixture-of-experts blocks (any sublayer
    with ``replay_counts``) since the last take: replayed tokens whose router's own top-k set is
    the replayed one, and replayed tokens; None when nothing was replayed. Resets the counts."""
    same = recorded = 0.0
    found = False
    for layer in model.sublayers(include_self=True):
        counts = getattr(layer, "replay_counts", None)
        if counts is not None:
            same, recorded, found = same + float(counts[0]), recorded + float(counts[1]), True
            layer.replay_counts = None
    return (same, recorded) if found else None


def agreement_metric(model):
    """``{"moe/replay_agreement": same / recorded}`` of `take_replay_agreement`, ``{}`` when
    nothing was replayed."""
    counts = take_replay_agreement(model)
    if counts is None or counts[1] == 0:
        return {}
    return {"moe/replay_agreement": counts[0] / counts[1]}
