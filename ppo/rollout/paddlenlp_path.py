"""The rollout engine's `use_rollout_engine=False` path (argument `use_fusemt false`): PaddleNLP's
own `generate`, its output cut at the stop tokens / sequences, and the per-token log-probs from
one forward pass (PaddleNLP reports only their mean)."""
import time

import numpy as np
import paddle
import paddle.nn.functional as F


def stop_lengths(generated, stop_ids, stop_seqs, min_new_tokens):
    """Response length per row `[B]` int64 of `generated [B, T]` (numpy): up to and including the
    first stop token or the end of the first stop sequence after `min_new_tokens` tokens."""
    stops = set(stop_ids)
    lengths = np.zeros(len(generated), dtype=np.int64)
    for b, row in enumerate(generated):
        n = len(row)
        for t in range(len(row)):
            done = t + 1 >= min_new_tokens and (
                int(row[t]) in stops or any(t + 1 >= len(s) and list(row[t + 1 - len(s): t + 1]) == s for s in stop_seqs)
            )
            if done:
                n = t + 1
                break
        lengths[b] = n
    return lengths


def forward_logprobs(lm, input_ids, attention_mask, response_ids, temperature):
    """Log-probs `[B, Tr]` of `response_ids` after the left-padded prompts, at `temperature`."""
    Tp, Tr = input_ids.shape[1], response_ids.shape[1]
    seq = paddle.concat([input_ids, response_ids], axis=1)
    mask = paddle.concat([attention_mask, paddle.ones_like(response_ids)], axis=1)
    logits = lm(input_ids=seq, attention_mask=mask, position_ids=(paddle.cumsum(mask, axis=1) - 1).clip(min=0), use_cache=False)
    logits = logits[0] if isinstance(logits, (tuple, list)) else getattr(logits, "logits", logits)
    logits = logits[:, Tp - 1: Tp - 1 + Tr].astype("float32") / temperature
    return paddle.take_along_axis(F.log_softmax(logits, axis=-1), response_ids.unsqueeze(-1), axis=-1).squeeze(-1)


def generate_with_paddlenlp(engine, lm, input_ids, attention_mask, p, seed, stop_ids, stop_seqs):
    """`RolloutEngine.generate` through PaddleNLP's `generate` (`engine`: its pad id and `_finish`)."""
    t_start = time.perf_counter()
    B, N = input_ids.shape[0], p.max_new_tokens
    if not stop_ids:
        raise NotImplementedError("PaddleNLP's generate (use_fusemt false) needs at least one stop token id (its eos_token_id)")
    if seed is not None:
        paddle.seed(seed)
    gen = lm.generate(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=(paddle.cumsum(attention_mask, axis=1) - 1).clip(min=0),
        max_new_tokens=N, min_new_tokens=p.min_new_tokens, decode_strategy="sampling" if p.do_sample else "greedy_search",
        temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, repetition_penalty=p.repetition_penalty,
        eos_token_id=stop_ids[0] if len(stop_ids) == 1 else stop_ids, pad_token_id=engine.pad_token_id, use_cache=True,
    )[0]  # [B, <= N] new tokens only, padded after EOS
    gen_np = gen.numpy()
    lengths = stop_lengths(gen_np, stop_ids, stop_seqs, p.min_new_tokens)
    out = np.full((B, N), engine.pad_token_id, dtype=np.int64)
    for b, n in enumerate(lengths):
        out[b, :n] = gen_np[b, :n]
    t_gen = time.perf_counter() - t_start
    Tr = max(int(lengths.max()), 1)
    response_ids = paddle.to_tensor(out[:, :Tr], place=input_ids.place)
    out_lp = paddle.zeros([B, N], dtype="float32")
    out_lp[:, :Tr] = forward_logprobs(lm, input_ids, attention_mask, response_ids, p.temperature)
    res = engine._finish(input_ids, attention_mask, paddle.to_tensor(out, place=input_ids.place), out_lp,
                         paddle.to_tensor(lengths, place=input_ids.place), t_start, 0.0, int(gen.shape[1]), match=True)
    res.stats["generate_s"] = t_gen
    return res
