"""Sampling settings and the rollout result."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import paddle


@dataclass
class SamplingParams:
    """How to generate. Names follow PaddleNLP/HF (`min_new_tokens` is PaddleNLP's `min_dec_len`)."""

    max_new_tokens: int = 16
    """Upper bound on generated tokens per row (the stop token included)."""
    min_new_tokens: int = 1
    """Stop tokens are suppressed (logit -inf) while fewer than this many tokens are generated,
    and stop sequences do not end a row before it: no empty or EOS-only responses by default."""
    temperature: float = 1.0
    """Sampling temperature (> 0). The returned log-probs use it too, even for greedy decoding."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off). PaddleNLP's own default is 50; this is 0."""
    top_p: float = 1.0
    """Nucleus sampling on the (top-k renormalised) distribution: keep the most likely tokens while
    the mass before each one is < top_p (1.0 = off)."""
    repetition_penalty: float = 1.0
    """HF/PaddleNLP rule on every token already in the prompt (real positions) or generated:
    logit / p if logit > 0 else logit * p (1.0 = off)."""
    do_sample: bool = True
    """False: greedy (first argmax after penalty and min-length suppression)."""
    stop_token_ids: Optional[List[int]] = None
    """Tokens that end a row (kept in the response, masked in). None: [eos_token_id]."""
    stop_sequences: Optional[List[List[int]]] = None
    """Token-id sequences that end a row when the response ends with one of them."""
    stop_strings: Optional[List[str]] = None
    """Strings that end a row; needs `RolloutEngine(tokenizer=...)`. Each is matched as its own
    tokenization (tokenizer(s, add_special_tokens=False)), i.e. token-level, not character-level."""

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.min_new_tokens < 0 or self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens must be in [0, max_new_tokens]")
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not self.repetition_penalty > 0:
            raise ValueError("repetition_penalty must be > 0")


@dataclass
class RolloutOutput:
    """What `RolloutEngine.generate` returns. B rows, Tp prompt columns, Tr response columns."""

    sequences: paddle.Tensor
    """[B, Tp + Tr] int64: the prompt as given (left padding kept) + the response."""
    response_ids: paddle.Tensor
    """[B, Tr] int64: generated tokens, right-padded with pad_token_id after the stop token;
    Tr = the longest response in the batch (<= max_new_tokens)."""
    response_mask: paddle.Tensor
    """[B, Tr] float32: 1 for generated tokens up to and INCLUDING the stop token."""
    response_logprobs: paddle.Tensor
    """[B, Tr] float32: log_softmax(logits / temperature)[token] of the RAW model logits, i.e. before
    repetition penalty, min-length suppression and top-k/top-p truncation (what a full forward
    pass over `sequences` with the same temperature gives); 0 at masked positions."""
    response_lengths: paddle.Tensor
    """[B] int64: number of generated tokens per row (the stop token counted)."""
    logprobs_match_forward: bool
    """True when the trainer may use `response_logprobs` as its old log-probs instead of an extra
    forward pass: no repetition penalty (the values always describe the raw distribution; with a
    penalty the engine asks for the recomputation to be conservative)."""
    stats: Dict[str, float] = field(default_factory=dict)
    attention_mask: Optional[paddle.Tensor] = None
    """[B, Tp + Tr] int64: the prompt's attention mask followed by response_mask -- what the
    trainer's forward over `sequences` needs (position ids = cumsum(mask) - 1)."""
    """tokens (generated, summed over rows), decode_steps, prefill_s (weights, caches and the prompt
    pass), wall_s, tokens_per_s (tokens / wall_s), backend ("custom", "mixed" (compiled kernels but
    for those that failed their start-up check, see ops.py), "paddle" or "paddlenlp_generate"; the
    last also reports generate_s, the time before the log-prob pass)."""
    expert_indices: Optional[List[paddle.Tensor]] = None
    """Per mixture-of-experts layer ``[B, Tp + Tr, k]`` int64: the experts each token was routed to
    (`ppo.rollout.moe_mlp.RoutingRecord`, -1 where the engine never ran the token; at padding
    and after a row's end the values are the engine's routing of those filler tokens); None unless
    the engine's ``record_routing``. The training forward replays them with
    ``moe_expert_indices=[e.reshape([-1, k]) for e in expert_indices]``."""


def merge_outputs(parts, pad_token_id):
    """One `RolloutOutput` from the outputs of consecutive row chunks of one prompt batch (same
    prompt columns): responses right-padded to the longest (`pad_token_id`, mask and log-probs 0),
    stats summed (wall_s, tokens) or taken at their largest (decode_steps)."""
    Tp = parts[0].sequences.shape[1] - parts[0].response_ids.shape[1]
    Tr = max(p.response_ids.shape[1] for p in parts)

    def right(t, value):
        extra = Tr - t.shape[1]
        return t if extra == 0 else paddle.concat([t, paddle.full([t.shape[0], extra], value, t.dtype)], axis=1)

    response_ids = paddle.concat([right(p.response_ids, pad_token_id) for p in parts], axis=0)
    response_mask = paddle.concat([right(p.response_mask, 0.0) for p in parts], axis=0)
    prompt_ids = paddle.concat([p.sequences[:, :Tp] for p in parts], axis=0)
    prompt_mask = paddle.concat([p.attention_mask[:, :Tp] for p in parts], axis=0)
    stats = {k: sum(p.stats.get(k, 0) for p in parts) for k in ("tokens", "prefill_s", "wall_s")}
    stats.update(decode_steps=max(p.stats.get("decode_steps", 0) for p in parts), backend=parts[0].stats.get("backend"),
                 tokens_per_s=stats["tokens"] / stats["wall_s"] if stats["wall_s"] > 0 else 0.0, chunks=len(parts))
    return RolloutOutput(
        sequences=paddle.concat([prompt_ids, response_ids], axis=1),
        response_ids=response_ids,
        response_mask=response_mask,
        response_logprobs=paddle.concat([right(p.response_logprobs, 0.0) for p in parts], axis=0),
        response_lengths=paddle.concat([p.response_lengths for p in parts], axis=0),
        logprobs_match_forward=all(p.logprobs_match_forward for p in parts),
        stats=stats,
        attention_mask=paddle.concat([prompt_mask, response_mask.astype(prompt_mask.dtype)], axis=1),
        expert_indices=_merged_experts(parts, Tp + Tr),
    )


def _merged_experts(parts, length):
    """The parts' `expert_indices` stacked by rows, each right-padded with -1 to `length` columns."""
    if parts[0].expert_indices is None:
        return None

    def right(t):
        extra = length - t.shape[1]
        return t if extra == 0 else paddle.concat([t, paddle.full([t.shape[0], extra, t.shape[2]], -1, t.dtype)], axis=1)

    return [paddle.concat([right(p.expert_indices[i]) for p in parts], axis=0) for i in range(len(parts[0].expert_indices))]
