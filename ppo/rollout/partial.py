"""Partial rollouts: generation in chunks of tokens that a weight update may interrupt.

`generate_partial` decodes `chunk_tokens` new tokens at a time with `RolloutEngine.generate`.
Before each chunk it calls `at_boundary(chunk)`, which may load new weights into the engine's
model and returns the weights version that samples the chunk (`partial_chunks` is the same as a
generator that stops at each boundary, so one caller can hold several generations there). Rows
still unfinished after a chunk keep their tokens: the next chunk re-prefills prompt + tokens so
far under the weights then current (the KV cache of the old weights is dropped), as slime's
partial rollout does (`slime/rollout/sglang_rollout.py`, `abort`: requests unfinished at a weight update go back to
the data buffer with their partial response, and the next generation sends prompt + response)
and AReaL's interruptible generation (`areal/engine/sglang_remote.py`,
`RemoteSGLangEngine.agenerate`: a request aborted by `update_weights` is re-sent with its output
tokens appended to `input_ids` and `max_new_tokens` reduced, its tokens' log-probs and
`output_versions` accumulated). Each token keeps the log-prob of the weights that sampled it and
that version (`token_versions`).

The sampling uniforms are columns/steps of the one draw an uninterrupted call makes
(`ChunkDraw`), so with unchanged weights the tokens are the uninterrupted call's (the log-probs
equal up to the float rounding of a prefill against a decode step).
"""
import contextlib
from dataclasses import dataclass, replace

import numpy as np
import paddle

from .params import RolloutOutput


@dataclass(frozen=True)
class ChunkDraw:
    """A `seed` for `RolloutEngine.generate` that draws steps `[first_step, first_step + steps)`
    and the columns `columns` (global rows) of the `[total_steps, total_rows]` uniforms of `seed`."""

    seed: int
    first_step: int
    total_steps: int
    columns: tuple
    total_rows: int

    def uniforms(self, steps, row_offset, rows):
        """`[steps, rows]` float32 numpy: rows `[row_offset, row_offset + rows)` of `columns`."""
        u = np.random.default_rng(self.seed).random((self.total_steps, self.total_rows), dtype=np.float32)
        cols = list(self.columns)[row_offset : row_offset + rows]
        return u[self.first_step : self.first_step + steps][:, cols]


def _finished(out, stop_ids):
    """`[b]` bool numpy: rows of a chunk that ended (shorter than the chunk, or on a stop token)."""
    lengths = out.response_lengths.numpy()
    ids = out.response_ids.numpy()
    last = ids[np.arange(len(lengths)), np.maximum(lengths - 1, 0)]
    return (lengths < ids.shape[1]) | np.isin(last, stop_ids) | (lengths == 0)


def generate_partial(engine, input_ids, attention_mask, params, seed, chunk_tokens, at_boundary, row_offset=0,
                     total_rows=None):
    """`engine.generate` in chunks of `chunk_tokens` new tokens (an int, or `chunk -> int`: the size
    of chunk 0, 1, ...); returns `(RolloutOutput, token_versions)`,
    `token_versions` `[B, Tr]` int64 (the version of each response token, -1 after its row's
    end). `at_boundary(chunk) -> version` runs before chunk 0, 1, ... `input_ids` `[B, Tp]`
    left-padded as for `generate`; `seed` an int (not None: the chunks share one draw)."""
    return drive(partial_chunks(engine, input_ids, attention_mask, params, seed, chunk_tokens, row_offset, total_rows),
                 at_boundary)


def drive(chunks, at_boundary):
    """Run a `partial_chunks` generator to its end, asking `at_boundary(chunk)` for the version of
    each chunk; returns what the generator returns."""
    try:
        chunk = next(chunks)
        while True:
            chunk = chunks.send(int(at_boundary(chunk)))
    except StopIteration as done:
        return done.value


def partial_chunks(engine, input_ids, attention_mask, params, seed, chunk_tokens, row_offset=0, total_rows=None,
                   scope=contextlib.nullcontext):
    """The generator behind `generate_partial`: before each chunk it yields the chunk's number and
    takes the weights version that samples it (`version = yield chunk`), so a caller can hold
    several of them at one boundary (a rollout rank's batches of one step, `RolloutWorker`) and
    take a weight update once for all; returns `(RolloutOutput, token_versions)`. `scope()`: a
    context each chunk's `engine.generate` runs in (the model's offload scope)."""
    if params.stop_sequences or params.stop_strings:
        raise ValueError("partial rollout: stop_sequences / stop_strings are not supported (a sequence may span chunks)")
    if seed is None:
        raise ValueError("partial rollout needs a seed: the chunks draw from one seeded draw")
    B, N = input_ids.shape[0], params.max_new_tokens
    total_rows = B if total_rows is None else total_rows
    stop_ids = list(params.stop_token_ids) if params.stop_token_ids is not None else [engine.eos_token_id]
    prompt_mask = (input_ids != engine.pad_token_id).astype("int64") if attention_mask is None else attention_mask
    tokens = np.full([B, N], engine.pad_token_id, dtype=np.int64)
    logprobs, versions = np.zeros([B, N], dtype=np.float32), np.full([B, N], -1, dtype=np.int64)
    lengths, active, done, chunk = np.zeros([B], dtype=np.int64), np.arange(B), 0, 0
    while active.size and done < N:
        version = int((yield chunk))
        steps = min(chunk_tokens(chunk) if callable(chunk_tokens) else chunk_tokens, N - done)
        sel = paddle.to_tensor(active)
        ids = paddle.concat([paddle.index_select(input_ids, sel), paddle.to_tensor(tokens[active, :done])], axis=1)
        mask = paddle.concat([paddle.index_select(prompt_mask, sel), paddle.ones([active.size, done], "int64")], axis=1)
        draw = ChunkDraw(int(seed), done, N, tuple(int(row_offset + r) for r in active), int(total_rows))
        chunk_params = replace(params, max_new_tokens=steps, min_new_tokens=min(steps, max(0, params.min_new_tokens - done)))
        with scope():
            out = engine.generate(ids, mask, chunk_params, seed=draw)
        got, n = out.response_lengths.numpy(), out.response_ids.shape[1]
        tokens[active, done : done + n] = out.response_ids.numpy()
        logprobs[active, done : done + n] = out.response_logprobs.numpy()
        versions[active, done : done + n] = np.where(np.arange(n)[None, :] < got[:, None], version, -1)
        lengths[active] += got
        active, done, chunk = active[~_finished(out, stop_ids)], done + steps, chunk + 1
    return _output(input_ids, prompt_mask, tokens, logprobs, versions, lengths, engine, chunk, params)


def _output(input_ids, prompt_mask, tokens, logprobs, versions, lengths, engine, chunks, params):
    Tr = max(int(lengths.max()) if lengths.size else 0, 1)
    mask = (np.arange(Tr)[None, :] < lengths[:, None]).astype(np.float32)
    response_ids = paddle.to_tensor(tokens[:, :Tr])
    response_mask = paddle.to_tensor(mask)
    out = RolloutOutput(
        sequences=paddle.concat([input_ids, response_ids], axis=1), response_ids=response_ids, response_mask=response_mask,
        response_logprobs=paddle.to_tensor(logprobs[:, :Tr] * mask), response_lengths=paddle.to_tensor(lengths),
        logprobs_match_forward=params.repetition_penalty == 1.0, stats={"tokens": int(lengths.sum()), "chunks": chunks, "backend": engine.backend},
        attention_mask=paddle.concat([prompt_mask, response_mask.astype("int64")], axis=1))
    return out, paddle.to_tensor(np.where(mask > 0, versions[:, :Tr], -1))
