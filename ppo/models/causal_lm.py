"""Forward passes of causal LMs that every trainer shares: position ids from a mask, the
last real token, full logits, and token log-probs / entropy without full logits.

`causal_lm_token_logprobs` is the one entry point for log-probs of answer / response
tokens (SFT loss, DPO, PPO/GRPO old, reference and update passes). With
`chunk_size > 0` it runs the model with its LM head bypassed, takes the final hidden
states `[N, T, H]` and hands them with the head weight to
`ppo.algos.token_logprobs_from_hidden`, which only evaluates the masked positions,
`chunk_size` of them at a time (memory of order chunk x vocabulary instead of the
`[N, T, V]` float32 logits). `chunk_size = 0` keeps the full-logits path.

The call still goes through the outermost wrapper (DataParallel, fleet), so gradient
synchronisation hooks see the forward; only the head's own forward is replaced for
the duration of the call. PaddleNLP's Llama and Qwen2 heads (`LlamaLMHead`,
`Qwen2LMHead`) are a plain matmul with `weight [H, V]`, or `[V, H]` with
`transpose_y=True` when tied to the input embedding (Qwen2.5-0.5B).
"""
import contextlib
import logging

import paddle

from ..algos import (
    entropy_from_logits,
    last_nonzero_index,
    masked_mean,
    token_logprobs,
    token_logprobs_from_hidden,
    vocab_parallel_logprobs_from_hidden,
)
from .fused_train_ops import LOGIT_KERNELS
from .basics import unwrap_model
from .parallel_layers import group_all_reduce, model_parallel_identity, vocab_parallel_head

logger = logging.getLogger(__name__)
NOT_COUNTED = -100  # any negative label is not counted
DEFAULT_LOGPROB_CHUNK_SIZE = 512  # tokens per LM-head chunk; 512 x 151,936 float32 logits = 311 MB
_warned = set()


def position_ids_from_mask(attention_mask):
    """`cumsum(mask) - 1` clipped at 0: 0, 1, 2, ... over real tokens, 0 on (left) padding.
    `[N, T]` -> `[N, T]` int64."""
    return paddle.clip(paddle.cumsum(attention_mask.astype("int64"), axis=-1) - 1, min=0)


def last_token_index(mask):
    """Index of each row's last real token (largest index with `mask != 0`; right for left and
    right padding), 0 for an empty row. `[N, T]` -> `[N]` int64."""
    return paddle.clip(last_nonzero_index(mask), min=0)


def _output_logits(out):
    return out.logits if hasattr(out, "logits") else out[0]


def causal_lm_logits(model, input_ids, attention_mask, position_ids=None, dtype="float32", model_kwargs=None):
    """Full logits `[N, T, V]` in `dtype` (float32 unless `use_fp32_compute` is off) of a causal
    LM or its LoRA / DataParallel wrapper; `model_kwargs`: further forward arguments (a routing
    replay's ``moe_expert_indices``, `ppo.models.routing_replay`)."""
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, return_dict=True,
                **(model_kwargs or {}))
    return _output_logits(out).astype(dtype)


def lm_head_weight(model):
    """`(weight, transpose_y)` of the LM head of `model` (wrappers removed), or `(None, reason)`
    when the head cannot be evaluated from hidden states here (no `lm_head`, a bias, a
    vocabulary split across tensor-parallel ranks, sequence parallelism)."""
    lm = unwrap_model(model)
    head = getattr(lm, "lm_head", None)
    weight = getattr(head, "weight", None)
    if weight is None:
        return None, f"{type(lm).__name__} has no lm_head.weight"
    if getattr(head, "bias", None) is not None:
        return None, "the LM head has a bias"
    if getattr(weight, "is_distributed", False):
        return None, "the LM head's vocabulary is split across tensor-parallel ranks"
    if getattr(getattr(lm, "config", None), "sequence_parallel", False):
        return None, "sequence parallelism gathers inside the LM head"
    return weight, bool(getattr(head, "transpose_y", False))


@contextlib.contextmanager
def lm_head_replaced(model, head_fn):
    """Within the block, the LM head of `model` computes `head_fn(hidden_states [N, T, H])`
    and the model's `logits` output is that result. The head weight is used inside the
    model's forward, so data-parallel reducers see it in the graph."""
    head = unwrap_model(model).lm_head
    head.forward = lambda hidden_states, *args, **kwargs: head_fn(hidden_states)
    try:
        yield
    finally:
        del head.forward


def _forward_through_head(model, head_fn, input_ids, attention_mask, position_ids, model_kwargs=None):
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    with lm_head_replaced(model, head_fn):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, return_dict=True,
                    **(model_kwargs or {}))
    return _output_logits(out)


def final_hidden_states(model, input_ids, attention_mask, position_ids=None):
    """Final (normed) hidden states `[N, T, H]` of a causal LM, through its wrappers."""
    return _forward_through_head(model, lambda hidden: hidden, input_ids, attention_mask, position_ids)


def _shifted(labels, mask):
    """Labels and mask moved one column left (position t scores token t + 1), the last column
    masked: `[N, T]` -> `[N, T]`."""
    pad = paddle.full([labels.shape[0], 1], NOT_COUNTED, dtype=labels.dtype)
    shifted_labels = paddle.concat([labels[:, 1:], pad], axis=1)
    shifted_mask = None
    if mask is not None:
        shifted_mask = paddle.concat([mask[:, 1:], paddle.zeros([mask.shape[0], 1], dtype=mask.dtype)], axis=1)
    return shifted_labels, shifted_mask


def causal_lm_token_logprobs(
    model, input_ids, attention_mask, labels, mask=None, position_ids=None, temperature=1.0, chunk_size=DEFAULT_LOGPROB_CHUNK_SIZE,
    with_entropy=False, first_counted=1, dtype="float32", model_kwargs=None,
):
    """Log-prob (and entropy) of each counted token given the tokens before it.

    `labels [N, T]` is in input alignment: `labels[:, t]` is the token at position t
    (scored by the output at t - 1), `< 0` (e.g. -100) where it does not count; `mask [N, T]`
    (optional, same alignment) narrows the counted tokens further. Returns
    `(logprobs [N, T-1], entropy [N, T-1] or None)` aligned with `labels[:, 1:]`, in `dtype`,
    0 where not counted (`dtype`: float32, PaddleNLP's `use_fp32_compute`; the training dtype
    computes the logits' softmax without upcasting them, as PaddleNLP with it off); the distribution is `softmax(logits / temperature)`.

    `chunk_size > 0`: hidden states through the LM head in chunks of that many counted
    tokens (`ppo.algos.token_logprobs_from_hidden`); `0`: full `[N, T, V]` logits. A head
    that cannot be chunked (see `lm_head_weight`) falls back to full logits, logged once.
    `first_counted`: no token before this position counts (e.g. the prompt width for PPO
    responses); the full-logits path then only normalises the logits from there on (the
    chunked path skips uncounted positions anyway).

    A tensor-parallel model whose LM head holds a slice of the vocabulary never gathers the
    vocabulary: each rank computes its slice's logits at the counted positions and
    `ppo.algos.vocab_parallel_logprobs_from_hidden` all-reduces the per-token statistics,
    `chunk_size` positions at a time as on one rank. `model_kwargs`: further forward arguments
    (a routing replay's ``moe_expert_indices``).
    """
    split_head = vocab_parallel_head(model)
    if split_head is not None:
        return _vocab_parallel_logprobs(
            model, split_head, input_ids, attention_mask, labels, mask, position_ids, temperature, chunk_size, with_entropy,
            dtype, model_kwargs,
        )
    weight, transpose_y = None, False
    if chunk_size and chunk_size > 0:
        weight, detail = lm_head_weight(model)
        if weight is not None:
            transpose_y = detail
        elif detail not in _warned:
            _warned.add(detail)
            logger.warning(f"logprob_chunk_size={chunk_size} not used, log-probs come from full logits: {detail}")
    shifted_labels, shifted_mask = _shifted(labels, mask)
    if weight is not None:

        def head_fn(hidden):  # [N, T, H] -> [N, T, 1 or 2]: log-probs (and entropy) stacked
            logp, entropy = token_logprobs_from_hidden(
                hidden, weight, shifted_labels, shifted_mask, temperature, chunk_size, transpose_y, with_entropy,
                kernels=LOGIT_KERNELS, dtype=dtype,
            )
            return paddle.stack([logp, entropy] if with_entropy else [logp], axis=-1)

        packed = _forward_through_head(model, head_fn, input_ids, attention_mask, position_ids, model_kwargs)
        return packed[:, :-1, 0], (packed[:, :-1, 1] if with_entropy else None)
    return _full_logits_logprobs(
        model, input_ids, attention_mask, position_ids, shifted_labels, shifted_mask, temperature, with_entropy, first_counted,
        dtype, model_kwargs,
    )


def _full_logits_logprobs(model, input_ids, attention_mask, position_ids, shifted_labels, shifted_mask, temperature,
                          with_entropy, first_counted, dtype="float32", model_kwargs=None):
    """`causal_lm_token_logprobs` from full `[N, T, V]` logits, normalised from output column
    `first_counted - 1` on (the columns before it are 0); labels and mask already shifted."""
    start = max(first_counted, 1) - 1  # first output column that can count
    logits = causal_lm_logits(model, input_ids, attention_mask, position_ids, dtype, model_kwargs)[:, start:-1]
    targets = shifted_labels[:, start:-1]
    counted = targets >= 0
    if shifted_mask is not None:
        counted = paddle.logical_and(counted, shifted_mask[:, start:-1] != 0)
    zeros = paddle.zeros(counted.shape, dtype)
    logp = paddle.where(counted, token_logprobs(logits, targets, temperature=temperature), zeros)
    entropy = None
    if with_entropy:
        scaled = logits if temperature == 1.0 else logits / temperature
        entropy = paddle.where(counted, entropy_from_logits(scaled), zeros)
    if start:
        left = paddle.zeros([logp.shape[0], start], dtype)
        logp = paddle.concat([left, logp], axis=1)
        entropy = paddle.concat([left, entropy], axis=1) if with_entropy else None
    return logp, entropy


def _vocab_parallel_logprobs(model, split_head, input_ids, attention_mask, labels, mask, position_ids, temperature,
                             chunk_size, with_entropy, dtype="float32", model_kwargs=None):
    """`causal_lm_token_logprobs` for a column-parallel LM head (see there): the counted
    positions' hidden states times this rank's head slice, `chunk_size` positions at a time
    (`ppo.algos.vocab_parallel_logprobs_from_hidden`); the hidden states enter through the
    model-parallel identity, whose backward sums the slices' gradients."""
    weight, transpose_y, vocab_start, group = split_head
    shifted_labels, shifted_mask = _shifted(labels, mask)
    all_reduce = group_all_reduce(group)

    def head_fn(hidden):  # [N, T, H] -> [N, T, 1 or 2]: log-probs (and entropy) stacked
        logp, entropy = vocab_parallel_logprobs_from_hidden(
            model_parallel_identity(hidden, group), weight, shifted_labels, shifted_mask, vocab_start, all_reduce,
            temperature, chunk_size, transpose_y, with_entropy, dtype,
        )
        return paddle.stack([logp, entropy] if with_entropy else [logp], axis=-1)

    packed = _forward_through_head(model, head_fn, input_ids, attention_mask, position_ids, model_kwargs)
    return packed[:, :-1, 0], (packed[:, :-1, 1] if with_entropy else None)


def answer_nll(model, input_ids, attention_mask, labels, chunk_size=DEFAULT_LOGPROB_CHUNK_SIZE, position_ids=None):
    """Token-mean negative log-likelihood of the answer tokens (`labels [N, T]`, -100 off the
    answer; position t predicts token t + 1) and the token log-probs `[N, T-1]`: the SFT loss
    and PPO's ptx loss. `position_ids` (default: from a `[N, T]` mask) must be given with a
    4-D mask (packed rows, `ppo.data.packing`)."""
    logprobs, _ = causal_lm_token_logprobs(
        model, input_ids, attention_mask, labels, position_ids=position_ids, chunk_size=chunk_size
    )
    return -masked_mean(logprobs, labels[:, 1:] >= 0), logprobs
