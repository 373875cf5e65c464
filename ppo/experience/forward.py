"""The forward passes that turn a rollout into log-probs and values: `response_logprobs` and
`response_values` (`[N, Tr]`, the response columns of `sequences [N, T]`), `response_slice`,
and `in_chunks` (a pass over row chunks of an experience). The math on top of them lives in
`ppo/algos/`."""
import paddle

from ..models.causal_lm import DEFAULT_LOGPROB_CHUNK_SIZE, causal_lm_token_logprobs
from ..models.routing_replay import packed_routing, replay_kwargs
from ..models.unpadded import pack_padded, packed_token_logprobs


def response_slice(tensor, prompt_len, response_len):
    """Columns predicting the response: `[N, T, ...]` -> `[N, Tr, ...]`."""
    return tensor[:, prompt_len - 1 : prompt_len - 1 + response_len]


def response_logprobs(model, exp, temperature, chunk_size=DEFAULT_LOGPROB_CHUNK_SIZE, with_entropy=False,
                      remove_padding=False, dtype="float32", replay=False):
    """Log-probs `[N, Tr]` of the response tokens under `model` at `temperature` and, with
    `with_entropy`, the entropy `[N, Tr]` of each predicting distribution (else None); both 0
    outside the response mask. The LM head runs over response tokens only, `chunk_size` at a
    time (0: full logits). `remove_padding`: the model runs on the rows' real tokens packed
    together (`ppo.models.unpadded`), with the same results. `dtype`: of the logits' softmax and
    the results (float32; the training dtype with PaddleNLP's `use_fp32_compute` off). `replay`:
    the forward uses the experts of `exp.routing` (routing replay; nothing when it is None)."""
    P = exp.prompt_len
    routing = exp.routing if replay else None
    mask = paddle.concat([paddle.zeros([len(exp), P], "float32"), exp.response_mask.astype("float32")], axis=1)
    Tr = exp.response_ids.shape[1]
    if remove_padding:
        packed = pack_padded(exp.sequences, exp.attention_mask)
        replayed = replay_kwargs(None if routing is None else packed_routing(packed, routing))
        logprobs, entropy = packed_token_logprobs(model, packed, mask, temperature, chunk_size, with_entropy, dtype, replayed)
        return logprobs[:, P:P + Tr], (entropy[:, P:P + Tr] if with_entropy else None)
    logprobs, entropy = causal_lm_token_logprobs(
        model, exp.sequences, exp.attention_mask, exp.sequences, mask=mask, position_ids=exp.position_ids,
        temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy, first_counted=P, dtype=dtype,
        model_kwargs=replay_kwargs(routing),
    )
    return response_slice(logprobs, P, Tr), (response_slice(entropy, P, Tr) if with_entropy else None)


def response_values(critic, exp, remove_padding=False):
    """Critic values `[N, Tr]`: the value of the state before each response token.
    `remove_padding`: the critic runs on the rows' real tokens packed together."""
    if remove_padding:
        packed = pack_padded(exp.sequences, exp.attention_mask)
        out = critic(input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=packed.position_ids,
                     ends=packed.ends)
        scores = packed.to_padded(out.scores)
    else:
        scores = critic(input_ids=exp.sequences, attention_mask=exp.attention_mask, position_ids=exp.position_ids).scores
    return response_slice(scores, exp.prompt_len, exp.response_ids.shape[1]) * exp.response_mask


def in_chunks(fn, exp, chunk_size):
    """Apply `fn(sub_experience)` to row chunks of `exp` and concatenate the outputs."""
    n = len(exp)
    if n <= chunk_size:
        return fn(exp)
    outs = [fn(exp.select(list(range(s, min(s + chunk_size, n))))) for s in range(0, n, chunk_size)]
    return paddle.concat(outs, axis=0)
