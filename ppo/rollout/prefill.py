"""Next-token logits of left-padded prompts by the rollout engine's prefill alone.

A model-as-judge reads a rubric prompt and needs only the distribution of the token that comes
next (a verdict such as "Yes"/"No", or a score digit): one prefill pass, no decode loop and no
sampling. `prefill_logits` runs exactly the first stage of `RolloutEngine.generate` (weights read
once, the whole prompt through the engine's kernels with its KV cache written, the last
position's logits kept) and returns those logits. With `use_rollout_engine=False` on the engine
(the run argument `use_fusemt false`) it is one plain forward of the model instead.
"""
import math

import paddle

from .step_inputs import on_place
from .weights import _decoder, extract_weights, rotary_tables, unwrap_model

__all__ = ["prefill_logits"]


def _check_prompts(input_ids, attention_mask):
    if len(input_ids.shape) != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [B, Tp] batch, got shape {input_ids.shape}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must have the shape of input_ids")
    if bool((attention_mask[:, -1] == 0).any()):
        raise ValueError("prefill_logits: prompts must be LEFT-padded and non-empty (the last column is a pad in some row)")


def _engine_prefill(engine, lm, input_ids, attention_mask):
    ops = engine._select_ops(lm)
    layout = engine._layout(lm, input_ids.place)
    W = extract_weights(lm, fuse_gate_up=engine._gate_up_fused(lm), layout=layout, pack_transposed=ops.pack_transposed,
                        workspace=engine._buffers.setdefault("weights", {}) if engine.keep_buffers else None,
                        sharded=engine.sharded)
    B, Tp = input_ids.shape
    cos, sin = rotary_tables(W, Tp, W.dtype)
    k_cache, v_cache = engine._kv_buffers(len(W.layers), B, W.num_kv_heads, W.head_dim, Tp, W.dtype)
    cache = {"k": k_cache, "v": v_cache, "cos": cos, "sin": sin, "scale": 1.0 / math.sqrt(W.head_dim)}
    positions = (paddle.cumsum(attention_mask, axis=1) - 1).clip(min=0)
    finished = paddle.zeros([B], dtype="int32")
    return engine._forward(W, cache, input_ids, positions, attention_mask.astype("int32"), finished, 0, prefill=True)


def _plain_forward(lm, input_ids, attention_mask):
    positions = (paddle.cumsum(attention_mask, axis=1) - 1).clip(min=0)
    out = lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, return_dict=True)
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[:, -1].astype("float32")


def prefill_logits(engine, input_ids, attention_mask=None):
    """Float32 logits `[B, V]` of the token after each LEFT-padded prompt (`input_ids [B, Tp]`,
    `attention_mask [B, Tp]`, default `input_ids != pad`), from `engine`'s model (a `RolloutEngine`)
    with its current weights (LoRA deltas added), without gradients; the model is left in the
    train/eval mode it was in."""
    lm = unwrap_model(engine.model)
    place = _decoder(lm).embed_tokens.weight.place
    input_ids = on_place(input_ids, place, "int64")
    if attention_mask is None:
        attention_mask = (input_ids != engine.pad_token_id).astype("int64")
    attention_mask = on_place(attention_mask, place, "int64")
    _check_prompts(input_ids, attention_mask)
    was_training = lm.training
    lm.eval()
    try:
        with paddle.no_grad():
            if engine.use_rollout_engine:
                return _engine_prefill(engine, lm, input_ids, attention_mask)
            return _plain_forward(engine.model, input_ids, attention_mask)
    finally:
        if was_training:
            lm.train()
