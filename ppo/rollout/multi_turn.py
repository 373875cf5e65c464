"""Decoding rows that advance independently: the rollout engine's kernels over one shared KV cache.

The engine's attention op writes the fed tokens of every unfinished row at the same cache
slots ``t0 .. t0 + Tq - 1`` and attends over slots ``< t0 + Tq`` that the key mask allows,
with per-row position ids. :class:`SlotDecoder` uses that to let each row of a batch do its own
thing at each step, with at most two forward passes (one chunk, one decode step):

- a row that is decoding feeds its last sampled token, all such rows in one decode pass;
- a row whose tool answered feeds the whole answer (glue, answer, glue, and the token that
  ended its turn) in one chunked-prefill pass onto its existing cache, over the rows that feed
  a chunk only (their q/k/v are scattered into the batch for the attention kernel and gathered
  back, so the pass costs what those rows' tokens cost), each row's tokens at the END of the
  chunk (left-padded within it), so the pass's last position is every row's latest token;
- a row that is waiting for its tool, or done, feeds nothing: the kernels skip it (its
  ``finished`` flag is set for the pass) and its key mask stays 0 on the slots the others use.

So slot ``t`` of the cache belongs to different tokens (or to nothing) in different rows; the
key mask (``[B, S]``: one bit per row and slot) says which slots hold a real token of the row,
and position ids come from the row's own token count, never from the slot. Attention sums
over the same keys as a fresh prefill of the row's whole conversation, in slot order; the
test compares the two. Rows never re-prefill their conversation; the price is slots that
some rows leave empty (a waiting row's, the padding of a chunk, the other pass's slots), which
the attention kernels still read past (masked) -- so the cache starts zeroed. When the slots run
out, each row's tokens are packed to the front of the cache if they fill at most half of it
(the same keys in the same order), else the cache doubles; rows that are done are gathered out
of the batch (``compact``), as the single-turn loop does.

Sampling: each row draws from its own stream of uniforms (seed, global row index), one per
sampled token, so a row samples the same tokens however the other rows are scheduled.
"""
import math

import numpy as np
import paddle
import paddle.nn.functional as F

from .step_inputs import _U_MAX, on_place
from .weights import _decoder, extract_weights, rotary_tables


class SlotDecoder:
    """One multi-turn batch on the engine's kernels (see the module docstring).

    Args:
        engine: the RolloutEngine (its op set, layout and forward pass).
        lm: the unwrapped causal LM.
        batch_size: rows (trajectories).
        max_positions: the most tokens any row will hold (position-id table size).
        params: SamplingParams (temperature, top_k, top_p, do_sample; no repetition penalty).
        seed / row_offset: uniform streams; row b draws from (seed, row_offset + b).
    """

    def __init__(self, engine, lm, batch_size, max_positions, params, *, seed=None, row_offset=0):
        if params.repetition_penalty != 1.0:
            raise NotImplementedError("multi-turn rollouts sample without a repetition penalty (repetition_penalty 1.0)")
        self.engine, self.params = engine, params
        self.ops = engine._select_ops(lm)
        self.place = _decoder(lm).embed_tokens.weight.place
        layout = engine._layout(lm, self.place)
        self.W = extract_weights(lm, fuse_gate_up=engine._gate_up_fused(lm), layout=layout,
                                 pack_transposed=self.ops.pack_transposed, sharded=engine.sharded,
                                 group=engine.tensor_parallel_group)
        cos, sin = rotary_tables(self.W, max_positions, self.W.dtype)
        self.cache = {"cos": cos, "sin": sin, "scale": 1.0 / math.sqrt(self.W.head_dim)}
        self.rows = list(range(batch_size))  # trajectory index of each batch row
        self.lengths = np.zeros(batch_size, np.int64)  # tokens in the cache per row = next position id
        self.draws = np.zeros(batch_size, np.int64)
        self.t = 0  # next free slot
        self._allocate(batch_size, 8 * ((max_positions + 7) // 8))
        self.uniforms = self._uniform_table(batch_size, max_positions, seed, row_offset)
        self.forward_passes, self.fed_tokens, self.chunk_passes, self.chunk_rows = 0, 0, 0, 0
        self.compactions = self.repacks = 0

    def _allocate(self, B, S):
        W = self.W
        L, nkv, hd = len(W.layers), W.num_kv_heads, W.head_dim
        # zeros, not empty: a row's slots that other rows used while it waited are read (masked,
        # weight 0) by its attention, and 0 * garbage can be NaN
        self.cache["k"] = paddle.zeros([L, B, nkv, hd, S], dtype=W.dtype)
        self.cache["v"] = paddle.zeros([L, B, nkv, S, hd], dtype=W.dtype)
        self.key_mask = paddle.zeros([B, S], dtype="int32")

    def _uniform_table(self, B, steps, seed, offset):
        if not self.params.do_sample:
            return np.zeros((B, steps), np.float32)
        table = [np.random.default_rng(None if seed is None else [seed, offset + b]).random(steps, dtype=np.float32)
                 for b in range(B)]
        return np.minimum(np.stack(table), np.float32(_U_MAX))

    @property
    def slots(self):
        return int(self.key_mask.shape[1])

    def _make_room(self, Tq):
        """Slots for a pass of Tq tokens: as they are, or the rows' tokens packed to the front of
        the cache when they fill at most half of it (`_repack`), or a cache twice as long."""
        if self.t + Tq <= self.slots:
            return
        if int(self.lengths.max()) + Tq <= self.slots // 2:
            self._repack()
        else:
            self._grow(self.t + Tq)

    def _repack(self):
        """Move each row's real slots (key mask 1), in order, to slots 0 .. length - 1: the same
        keys in the same order, the empty slots between them gone."""
        mask = self.key_mask.numpy().astype(bool)
        M = max(int(self.lengths.max()), 1)
        order = np.zeros((len(self.rows), M), np.int64)
        for b in range(len(self.rows)):
            real = np.nonzero(mask[b])[0]
            order[b, : len(real)] = real
        B = len(self.rows)
        index = on_place(order, self.place, "int64")
        k = paddle.take_along_axis(self.cache["k"], index.reshape([1, B, 1, 1, M]), axis=4, broadcast=True)
        v = paddle.take_along_axis(self.cache["v"], index.reshape([1, B, 1, M, 1]), axis=3, broadcast=True)
        self.cache["k"][:, :, :, :, :M] = k
        self.cache["v"][:, :, :, :M] = v
        self.key_mask[:] = 0
        self.key_mask[:, :M] = on_place(np.arange(M)[None, :] < self.lengths[:, None], self.place, "int32")
        self.t, self.repacks = M, self.repacks + 1

    def _grow(self, needed):
        S = self.slots
        if needed <= S:
            return
        new = 8 * ((max(2 * S, needed) + 7) // 8)
        k, v, mask = self.cache["k"], self.cache["v"], self.key_mask
        self._allocate(int(mask.shape[0]), new)
        self.cache["k"][:, :, :, :, :S] = k
        self.cache["v"][:, :, :, :S] = v
        self.key_mask[:, :S] = mask

    def compact(self, keep):
        """Keep only the rows whose trajectory index is in `keep` (the others are done)."""
        idx = [b for b, r in enumerate(self.rows) if r in keep]
        if len(idx) == len(self.rows):
            return
        self.compactions += 1
        index = paddle.to_tensor(idx, dtype="int64", place=self.place)
        self.cache["k"] = paddle.index_select(self.cache["k"], index, axis=1)
        self.cache["v"] = paddle.index_select(self.cache["v"], index, axis=1)
        self.key_mask = paddle.index_select(self.key_mask, index, axis=0)
        self.rows = [self.rows[b] for b in idx]
        self.lengths, self.draws = self.lengths[idx], self.draws[idx]
        self.uniforms = self.uniforms[idx]

    def step(self, feeds, suppress_rows=(), forced=None):
        """Feed `feeds` ({trajectory index: token ids}) and sample the next token of every fed
        row; returns {trajectory index: (token, log-prob)}. Rows fed several tokens go through one
        chunked-prefill pass over those rows only, rows fed one token through one decode pass.
        Rows in `suppress_rows` cannot sample a stop token (min_new_tokens). `forced`
        ({trajectory index: token}): those rows take that token instead of sampling (no uniform
        drawn), with its log-prob under the same distribution (log_softmax(logits / T))."""
        forced = forced or {}
        chunk = [b for b, r in enumerate(self.rows) if len(feeds.get(r, ())) > 1]
        single = [b for b, r in enumerate(self.rows) if len(feeds.get(r, ())) == 1]
        out = {}
        if chunk:
            out.update(self._pass(chunk, feeds, suppress_rows, forced, prefill=True))
        if single:
            out.update(self._pass(single, feeds, suppress_rows, forced, prefill=False))
        return out

    def _layout(self, idx, feeds):
        """Token ids of the rows `idx` ([len(idx), Tq], each row's tokens at the end), position ids
        and fed flags of the whole batch ([B, Tq])."""
        Tq = max(len(feeds[self.rows[b]]) for b in idx)
        ids = np.full((len(idx), Tq), self.engine.pad_token_id, np.int64)
        pos = np.repeat(self.lengths[:, None], Tq, axis=1)
        real = np.zeros((len(self.rows), Tq), np.int32)
        for j, b in enumerate(idx):
            tokens = feeds[self.rows[b]]
            m = len(tokens)
            ids[j, Tq - m:] = tokens
            pos[b, Tq - m:] = self.lengths[b] + np.arange(m)
            real[b, Tq - m:] = 1
        return ids, pos, real, Tq

    def _pass(self, idx, feeds, suppress_rows, forced, prefill):
        """One forward pass feeding the rows `idx` (the others skipped) and their samples."""
        B = len(self.rows)
        ids, pos, real, Tq = self._layout(idx, feeds)
        self._make_room(Tq)
        t0 = self.t
        self.key_mask[:, t0: t0 + Tq] = on_place(real, self.place, "int32")
        fed = real.any(axis=1)
        finished = on_place((~fed).astype(np.int32), self.place, "int32")
        if prefill:  # the fed rows only: their q/k/v meet the cache rows in _RowSubset.attention
            index = on_place(np.asarray(idx, np.int64), self.place, "int64")
            ops = _RowSubset(self.ops, index, B) if len(idx) < B else self.ops
            logits = self.engine._forward(self.W, self.cache, on_place(ids, self.place, "int64"),
                                          on_place(pos, self.place, "int64"), self.key_mask, finished, t0, True, ops=ops)
            rows_b, active, cols = list(idx), np.ones(len(idx), bool), False
            self.chunk_passes, self.chunk_rows = self.chunk_passes + 1, self.chunk_rows + len(idx)
        else:  # every row's slot of the step (pad for the rows not fed, skipped by the kernels)
            step_ids = np.full(B, self.engine.pad_token_id, np.int64)
            step_ids[idx] = ids[:, 0]
            logits = self.engine._forward(self.W, self.cache, on_place(step_ids, self.place, "int64"),
                                          on_place(pos[:, 0], self.place, "int64"), self.key_mask, finished, t0, False)
            rows_b, active, cols = list(range(B)), fed, self.W.transposed
        take = np.asarray([active[j] and self.rows[b] in forced for j, b in enumerate(rows_b)], bool)
        tokens, logprobs = self._sample(logits, cols, rows_b, active & ~take, suppress_rows)
        if take.any():
            tokens, logprobs = self._take_forced(logits, cols, rows_b, take, forced, tokens, logprobs)
        self.t += Tq
        self.lengths += real.sum(axis=1)
        self.forward_passes += 1
        self.fed_tokens += int(real.sum())
        out = {}
        for j, b in enumerate(rows_b):
            if active[j]:
                out[self.rows[b]] = (int(tokens[j]), float(logprobs[j]))
                self.draws[b] += 0 if take[j] else 1
        return out

    def _take_forced(self, logits, cols, rows_b, take, forced, tokens, logprobs):
        """`tokens`/`logprobs` with the forced token and its log-prob at the logits' rows `take`."""
        js = np.flatnonzero(take)
        chosen = np.asarray([forced[self.rows[rows_b[j]]] for j in js], np.int64)
        table = paddle.transpose(logits, [1, 0]) if cols else logits
        picked = paddle.gather(table, on_place(js.astype(np.int64), self.place, "int64")).astype("float32")
        logp = F.log_softmax(picked / self.params.temperature, axis=-1)
        lp = paddle.take_along_axis(logp, on_place(chosen[:, None], self.place, "int64"), axis=-1).squeeze(-1)
        tokens, logprobs = tokens.copy(), logprobs.copy()
        tokens[js], logprobs[js] = chosen, lp.numpy()
        return tokens, logprobs

    def _sample(self, logits, cols, rows_b, active, suppress_rows):
        """Tokens and log-probs of the logits' rows (batch rows `rows_b`, sampled where `active`);
        two sampler calls when only some of them suppress stop tokens."""
        p, n = self.params, len(rows_b)
        u = self.uniforms[rows_b, np.minimum(self.draws[rows_b], self.uniforms.shape[1] - 1)]
        uniforms = on_place(u[None, :], self.place, "float32")
        rows = paddle.arange(n, dtype="int64")
        presence = paddle.zeros([1, 1], dtype="uint8")
        stop_ids = p.stop_token_ids if p.stop_token_ids is not None else [self.engine.eos_token_id]
        quiet = np.asarray([self.rows[b] in suppress_rows for b in rows_b])
        tokens, logprobs = np.zeros(n, np.int64), np.zeros(n, np.float32)
        for group, suppress in ((active & ~quiet, []), (active & quiet, stop_ids)):
            if not group.any():
                continue
            finished = on_place((~group).astype(np.int32), self.place, "int32")
            tok, lp = self.ops.sample(logits, presence, rows, uniforms, finished, 0, p.temperature, p.top_k, p.top_p,
                                      1.0, p.do_sample, self.engine.pad_token_id, suppress, cols)
            tokens = np.where(group, tok.numpy(), tokens)
            logprobs = np.where(group, lp.numpy(), logprobs)
        return tokens, logprobs


class _RowSubset:
    """The engine's op set for a pass over some rows of the cache (`index`, of `batch` rows): the
    layers run on those rows' tokens only, and `attention` scatters their q/k/v into the whole
    batch (the other rows finished: skipped by the kernel) and gathers their outputs back."""

    def __init__(self, ops, index, batch):
        self._ops, self._index, self._batch, self._full = ops, index, batch, None

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def attention(self, qkv, *args, **kwargs):
        if self._full is None:  # one buffer per pass: every layer overwrites the same rows
            self._full = paddle.zeros([self._batch] + list(qkv.shape[1:]), dtype=qkv.dtype)
        paddle.scatter_(self._full, self._index, qkv, overwrite=True)
        return paddle.gather(self._ops.attention(self._full, *args, **kwargs), self._index)


def prefill_logprobs(engine, lm, token_ids, temperature=1.0):
    """Log-prob of each next token of `token_ids` (``[T - 1]`` float32, position t scores token
    t + 1) from ONE pass of the engine's kernels over the whole sequence on a fresh cache: the
    reference that a multi-turn rollout's cached log-probs are checked against."""
    ops = engine._select_ops(lm)
    place = _decoder(lm).embed_tokens.weight.place
    W = extract_weights(lm, fuse_gate_up=engine._gate_up_fused(lm), layout=engine._layout(lm, place),
                        pack_transposed=ops.pack_transposed, sharded=engine.sharded,
                        group=engine.tensor_parallel_group)
    T = len(token_ids)
    S = 8 * ((T + 7) // 8)
    cos, sin = rotary_tables(W, T, W.dtype)
    L, nkv, hd = len(W.layers), W.num_kv_heads, W.head_dim
    cache = {"k": paddle.empty([L, 1, nkv, hd, S], dtype=W.dtype), "v": paddle.empty([L, 1, nkv, S, hd], dtype=W.dtype),
             "cos": cos, "sin": sin, "scale": 1.0 / math.sqrt(hd)}
    ids = on_place(np.asarray(token_ids, np.int64)[None, :], place, "int64")
    pos = on_place(np.arange(T, dtype=np.int64)[None, :], place, "int64")
    with paddle.no_grad():
        logits = engine._forward(W, cache, ids, pos, paddle.ones([1, T], dtype="int32"), paddle.zeros([1], dtype="int32"),
                                 0, prefill=True, all_positions=True)
        logp = F.log_softmax(logits[0, :-1].astype("float32") / temperature, axis=-1)
        picked = paddle.take_along_axis(logp, ids[0, 1:].unsqueeze(-1), axis=-1).squeeze(-1)
    return picked.numpy()
