"""The rollout engine: prefill, then a decode loop over a preallocated KV cache.

One `generate()` call:
 1. reads the model's current weights (`weights.extract_weights`: live parameters, with q/k/v
    concatenated and LoRA deltas added once per call);
 2. prefill: the whole left-padded prompt in one pass; position ids = cumsum(mask) - 1; every
    layer's rotated K and V go straight into caches allocated once (K [L, B, nkv, hd, Tp + N],
    transposed for the score kernel; V [L, B, nkv, Tp + N, hd]);
 3. decode loop, per step: sample (penalty, min-length suppression, temperature, top-k, top-p,
    log-prob of the raw distribution) -> bookkeeping (outputs, lengths, stop flags, positions)
    -> one forward of the B x 1 new tokens, writing K/V in place (no concatenation);
    finished rows are skipped by the kernels, and when half of the rows are done the batch is
    compacted (rows gathered out of the cache) so they stop costing matmul time too;
 4. results: response ids/mask/log-probs/lengths and the prompt + response sequences.

The per-step work is a handful of kernels (ops.py, compiled from csrc/): RMSNorm (+ residual
add), SwiGLU, attention over the cache (RoPE and the in-place K/V write included), sampling,
bookkeeping; and paddle.matmul for every projection (MKL on CPU, cuBLAS on GPU); which of
them run compiled is `kernels` (ops.py, kernel_check.py). On CPU everything is float32, and
models with hidden size >= 384 decode in the transposed "cols" layout (weights packed [out, in] once per call, see weights.py).

`use_rollout_engine=False` (the run argument `use_fusemt false`, PaddleNLP's name for its
fused generation switch) routes to the model's own PaddleNLP `generate()` instead, with the same
outputs (log-probs then come from one extra forward pass), for comparison.
"""
import logging
import math
import time

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F

from .ops import get_ops
from .paddlenlp_path import generate_with_paddlenlp
from .params import RolloutOutput, SamplingParams, merge_outputs
from .moe_mlp import RoutingRecord, routed_mlp
from .qk_norm import apply_qk_norm
from .step_inputs import on_place, prompt_presence, step_uniforms
from .weights import _decoder, compute_dtype_of, extract_weights, rotary_tables, unwrap_model

logger = logging.getLogger("ppo.rollout")

class RolloutEngine:
    """Fast generation for PPO / GRPO / evaluation.

    Args:
        model: PaddleNLP LlamaForCausalLM / Qwen2ForCausalLM or our Qwen3ForCausalLM, possibly wrapped in
            paddlenlp.peft.LoRAModel and/or paddle.DataParallel.
        eos_token_id, pad_token_id: ids; pad should differ from eos (masks come from lengths anyway).
        use_rollout_engine: True (default) decodes with this engine's loop and kernels; False calls
            PaddleNLP `generate` instead (the run argument `use_fusemt`).
        kernels: the run argument `rollout_kernels` (ops.py): "auto" (default) checks each compiled
            kernel once on the model's device and dtype (here, and again if the model moves) and
            runs the pure-Paddle twin of any that fails; "custom" unchecked; "paddle" no kernels.
        fuse_gate_up: concatenate gate/up weights once per call (one matmul instead of two) in
            the "rows" layout. None (default): only when hidden_size <= 256. ("cols" always fuses.)
        decode_layout: "cols" = every matrix packed transposed once per call and the decode step
            run on transposed activations (faster MKL shapes, see weights.py; CPU); "rows" = the
            model's own layout; "auto" (default) = "cols" on CPU with the custom ops when
            hidden_size >= 384, else "rows".
        keep_buffers: keep the KV cache and the packed ("cols") weight buffers allocated between
            calls and overwrite them (their contents are recomputed every call from the current
            weights; only the memory is reused, which saves the page faults of re-allocating
            ~2x the model size per call). free_buffers() releases them.
        tokenizer: needed only for SamplingParams.stop_strings.
        compact_ratio: compact the batch when active rows <= compact_ratio * current rows.
        keep_tensor_parallel: generation layout of a tensor-parallel model (the run argument
            `eval_mode`, PaddleNLP's name): False (default; eval_mode single or '') gathers the
            whole weights on every rank for each call; True (eval_mode tensor_parallel) keeps each
            rank's slices (heads, MLP columns/rows, vocabulary), all-reduces after o_proj,
            down_proj and the embedding, and all-gathers the logits before sampling, in the
            "rows" layout. Every rank draws the same tokens. No effect without tensor parallel.
        tensor_parallel_group: the model-parallel group of a tensor-parallel model (the run
            strategy's `generation_group()`); None for a model that is not split. A whole model
            with `keep_tensor_parallel` and a group of several ranks generates from this rank's
            slices of it (a split run's rollout replica, `ppo.rollout.tp_weights.TensorParallelSlices`).
    """

    def __init__(self, model, eos_token_id, pad_token_id, *, use_rollout_engine=True, kernels="auto", fuse_gate_up=None,
                 tokenizer=None, compact_ratio=0.5, decode_layout="auto", keep_buffers=True,
                 keep_tensor_parallel=False, max_num_seqs=-1, tensor_parallel_group=None, record_routing=False):
        self.sharded = bool(keep_tensor_parallel)
        self.record_routing, self._routing = bool(record_routing), None  # moe_mlp.RoutingRecord of a generate()
        self.tensor_parallel_group = tensor_parallel_group
        self.model = model
        self.eos_token_id = int(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.use_rollout_engine = bool(use_rollout_engine)
        self.tokenizer = tokenizer
        self.compact_ratio = float(compact_ratio)
        self.kernels, self.ops, self._ops_where = kernels, None, None
        if self.use_rollout_engine:
            self._select_ops(unwrap_model(model))
        self.fuse_gate_up = fuse_gate_up
        if decode_layout not in ("auto", "rows", "cols"):
            raise ValueError("decode_layout must be 'auto', 'rows' or 'cols'")
        self.decode_layout = decode_layout
        self.keep_buffers = bool(keep_buffers)
        self._buffers = {}
        self.max_num_seqs = int(max_num_seqs)

    @property
    def backend(self):
        return self.ops.name if self.use_rollout_engine else "paddlenlp_generate"

    # ------------------------------------------------------------------ public API
    def generate(self, input_ids, attention_mask=None, params=None, seed=None, row_offset=0, total_rows=None):
        """Generate responses for left-padded prompts; see RolloutOutput for what comes back.

        input_ids [B, Tp] int64 LEFT-padded; attention_mask [B, Tp] (1 = real token; default
        input_ids != pad); seed makes sampling reproducible (None: fresh entropy).
        `row_offset` / `total_rows`: these B rows are rows `[row_offset, row_offset + B)` of a
        global batch of `total_rows` (default B) split over data-parallel ranks: the engine
        draws the uniforms of the whole global batch from `seed` and keeps its rows' columns, so
        a row samples the same tokens whichever rank generates it (PaddleNLP's `generate`,
        `use_fusemt false`, draws from Paddle's global generator instead)."""
        total_rows = input_ids.shape[0] if total_rows is None else total_rows
        if not 0 <= row_offset <= total_rows - input_ids.shape[0]:
            raise ValueError(f"rows [{row_offset}, {row_offset + input_ids.shape[0]}) do not fit a batch of {total_rows}")
        B, cap = input_ids.shape[0], self.max_num_seqs  # PaddleNLP's rollout_max_num_seqs: decode in chunks of rows
        if 0 < cap < B:
            rows = lambda t, s: None if t is None else t[s : s + cap]  # noqa: E731
            # PaddleNLP's generate reseeds the global generator with `seed`: each chunk gets its own
            # seed there, else a chunk would repeat the first chunk's draws (copies of one prompt alike)
            chunk_seed = lambda s: seed if seed is None or self.use_rollout_engine else seed + s  # noqa: E731
            return merge_outputs([self.generate(rows(input_ids, s), rows(attention_mask, s), params, chunk_seed(s),
                                                row_offset + s, total_rows) for s in range(0, B, cap)], self.pad_token_id)
        params = params or SamplingParams()
        lm = unwrap_model(self.model)
        place = _decoder(lm).embed_tokens.weight.place
        input_ids = on_place(input_ids, place, "int64")
        if attention_mask is None:
            attention_mask = (input_ids != self.pad_token_id).astype("int64")
        else:
            attention_mask = on_place(attention_mask, place, "int64")
        if len(input_ids.shape) != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be a non-empty [B, Tp] batch, got shape {input_ids.shape}")
        if attention_mask.shape != input_ids.shape:
            raise ValueError("attention_mask must have the shape of input_ids")
        has_tokens = attention_mask.sum(axis=1) > 0
        if bool(((attention_mask[:, -1] == 0) & has_tokens).any()):
            raise ValueError("RolloutEngine: prompts must be LEFT-padded (the last column is a pad in some row)")
        stop_ids = list(params.stop_token_ids) if params.stop_token_ids is not None else [self.eos_token_id]
        stop_seqs = [list(map(int, s)) for s in (params.stop_sequences or []) if len(s) > 0]
        if params.stop_strings:
            if self.tokenizer is None:
                raise ValueError("SamplingParams.stop_strings needs RolloutEngine(tokenizer=...)")
            for s in params.stop_strings:
                ids = self.tokenizer(s, add_special_tokens=False)["input_ids"]
                if ids:
                    stop_seqs.append([int(i) for i in ids])
        was_training = lm.training
        lm.eval()
        try:
            with paddle.no_grad():
                if self.use_rollout_engine:
                    return self._generate_engine(lm, input_ids, attention_mask, params, (seed, row_offset, total_rows),
                                                 stop_ids, stop_seqs)
                return self._generate_paddlenlp(lm, input_ids, attention_mask, params, seed, stop_ids, stop_seqs)
        finally:
            if was_training:
                lm.train()

    # ------------------------------------------------------------------ engine path
    def _select_ops(self, lm):
        """The op set of `kernels` for where `lm` computes now (its embedding's place; float32 on
        CPU, else its dtype); "auto" checks the kernels there once per process."""
        embed = _decoder(lm).embed_tokens.weight
        if not embed._is_initialized():  # a pipeline stage's placeholder: its weights arrive when it generates
            return self.ops
        where = (str(embed.place), compute_dtype_of(embed))
        if where != self._ops_where:
            self.ops, self._ops_where = get_ops(self.kernels, embed.place, where[1]), where
        return self.ops

    def _gate_up_fused(self, lm):
        if self.fuse_gate_up is not None:
            return bool(self.fuse_gate_up)
        return lm.config.hidden_size <= 256

    def _layout(self, lm, place):
        """'cols' (transposed decode, see weights.py) on CPU with the custom ops for hidden sizes
        >= 384, else 'rows'. Measured here (bench/): 30M model (hidden 512) decode step -16%
        with 'cols'; the 4-layer hidden-256 model is ~8% faster with 'rows' (its matmuls gain
        nothing and the per-call packing and the extra transposes cost)."""
        group = self.tensor_parallel_group
        if self.sharded and (getattr(lm.config, "tensor_parallel_degree", 1) > 1 or (group is not None and group.nranks > 1)):
            if self.decode_layout == "cols":
                raise ValueError("RolloutEngine: keep_tensor_parallel (eval_mode tensor_parallel) runs the 'rows' layout; "
                                 "use decode_layout auto or rows")
            return "rows"
        if self.decode_layout != "auto":
            return self.decode_layout
        big = lm.config.hidden_size >= 384
        return "cols" if (big and self.ops.name == "custom" and place.is_cpu_place()) else "rows"

    def _forward(self, W, cache, ids, pos, key_mask, finished, t0, prefill, all_positions=False, ops=None, rows=None):
        """Run the decoder on ids ([B, T] prefill, [B] decode), writing K/V at cache slots t0..;
        returns float32 logits of the last position: [B, V], or [V, B] for a "cols" decode step
        (`all_positions`: of every prefill position, [B, T, V]). `ops`: another op set (the
        multi-turn rollout's, which runs a few rows of the cache; default the engine's). `rows`: the
        original rows of a decode batch (where `record_routing` files their experts)."""
        ops = ops or self.ops
        eps = W.eps
        cols = W.transposed and not prefill  # activations [H, B]: token b is column b
        tw = W.transposed
        if cols:
            def mm(x, w):
                return paddle.matmul(w, x)
        else:
            def mm(x, w):
                return paddle.matmul(x, w, transpose_y=tw)
        shard = W.shard
        h = self._embed(W, ids) if shard is not None and shard.embed_sharded else F.embedding(ids, W.embed)
        if cols:
            h = h.transpose([1, 0]).contiguous()
        res = h
        x = ops.rms_norm(h, W.layers[0].ln_attn, eps, cols)
        nlayers = len(W.layers)
        for li, lw in enumerate(W.layers):
            qkv = mm(x, lw.qkv)
            if lw.q_norm is not None:  # per-head RMSNorm of q and k before RoPE (Qwen3)
                qkv = apply_qk_norm(ops, qkv, lw.q_norm, lw.k_norm, W.num_heads, W.num_kv_heads, W.head_dim, eps, cols)
            a = ops.attention(qkv, cache["k"], cache["v"], cache["cos"], cache["sin"], pos, key_mask,
                              finished, li, t0, W.num_heads, W.num_kv_heads, W.head_dim, lw.qkv_layout,
                              cache["scale"], lw.qkv_bias, cols)
            x, res = ops.add_rms_norm(self._reduce(W, mm(a, lw.o)), res, lw.ln_mlp, eps, cols)
            if lw.moe is not None:  # routed experts, each on its own tokens
                d = routed_mlp(ops, x, lw.moe, cols, self._routing, li, t0, rows)
            else:
                m = ops.swiglu(mm(x, lw.gate_up), None, cols) if lw.gate_up is not None else \
                    ops.swiglu(mm(x, lw.gate), mm(x, lw.up), cols)
                d = self._reduce(W, mm(m, lw.down))
            if li + 1 < nlayers:
                x, res = ops.add_rms_norm(d, res, W.layers[li + 1].ln_attn, eps, cols)
            else:
                if prefill and len(d.shape) == 3 and not all_positions:  # only the last position's logits are needed
                    d = d[:, -1].contiguous()
                    res = res[:, -1].contiguous()
                x, res = ops.add_rms_norm(d, res, W.norm, eps, cols)
        if cols:
            logits = paddle.matmul(W.lm_head, x)  # [V, B]
        else:
            logits = paddle.matmul(x, W.lm_head, transpose_y=W.lm_head_transposed)
        if logits.dtype != paddle.float32:
            logits = logits.astype("float32")
        if shard is not None and shard.head_sharded:  # [B, V / R] per rank -> [B, V]
            parts = []
            dist.all_gather(parts, logits, group=shard.group)
            logits = paddle.concat(parts, axis=-1)
        return logits

    @staticmethod
    def _reduce(W, partial):
        """Sum of the ranks' partial products (row-parallel o_proj / down_proj); identity unsharded."""
        if W.shard is None:
            return partial
        dist.all_reduce(partial, group=W.shard.group)
        return partial

    @staticmethod
    def _embed(W, ids):
        """Vocabulary-parallel lookup: this rank's rows for its ids, zeros for the others, summed."""
        vocab_rows = int(W.embed.shape[0])
        local = ids - W.shard.vocab_start
        inside = (local >= 0) & (local < vocab_rows)
        h = F.embedding(paddle.where(inside, local, paddle.zeros_like(local)), W.embed)
        h = h * inside.unsqueeze(-1).astype(h.dtype)
        dist.all_reduce(h, group=W.shard.group)
        return h

    def _kv_buffers(self, L, B, nkv, hd, slots, dtype):
        """K^T [L, B, nkv, hd, S] and V [L, B, nkv, S, hd] caches, S >= slots a multiple of 8 (whole
        vectors in the kernels). Uninitialised: every slot is written before it is read (the
        prefill writes all prompt slots, pads included; decode writes each slot before use).
        With keep_buffers they are reused across calls of the same batch geometry."""
        S = (slots + 7) // 8 * 8
        kv = self._buffers.get("kv") if self.keep_buffers else None
        if kv is not None:
            k, v = kv
            ks = k.shape
            if ks[:4] == [L, B, nkv, hd] and ks[4] >= S and str(k.dtype).replace("paddle.", "") == dtype:
                return k, v
        k = paddle.empty([L, B, nkv, hd, S], dtype=dtype)
        v = paddle.empty([L, B, nkv, S, hd], dtype=dtype)
        if self.keep_buffers:
            self._buffers["kv"] = (k, v)
        return k, v

    def free_buffers(self):
        """Drop the KV-cache and packed-weight buffers kept between calls (keep_buffers)."""
        self._buffers.clear()

    def _generate_engine(self, lm, input_ids, attention_mask, p, draw, stop_ids, stop_seqs):
        """`draw`: `(seed, row_offset, total_rows)` of the uniforms (see `generate`)."""
        t_start = time.perf_counter()
        ops = self._select_ops(lm)
        layout = self._layout(lm, input_ids.place)
        W = extract_weights(lm, fuse_gate_up=self._gate_up_fused(lm), layout=layout,
                            pack_transposed=ops.pack_transposed,
                            workspace=self._buffers.setdefault("weights", {}) if self.keep_buffers else None,
                            sharded=self.sharded, group=self.tensor_parallel_group)
        (B, Tp), N = input_ids.shape, p.max_new_tokens
        dtype, place = W.dtype, input_ids.place
        cos, sin = rotary_tables(W, Tp + N, dtype)
        k_cache, v_cache = self._kv_buffers(len(W.layers), B, W.num_kv_heads, W.head_dim, Tp + N, dtype)
        cache = {"k": k_cache, "v": v_cache, "cos": cos, "sin": sin, "scale": 1.0 / math.sqrt(W.head_dim)}
        key_mask = attention_mask.astype("int32")
        pos_prefill = (paddle.cumsum(attention_mask, axis=1) - 1).clip(min=0)
        pos = attention_mask.sum(axis=1) - 1  # position id of each row's latest token
        finished = paddle.zeros([B], dtype="int32")
        rows = paddle.arange(B, dtype="int64")
        out_tokens = paddle.full([B, N], self.pad_token_id, dtype="int64")
        out_logprobs = paddle.zeros([B, N], dtype="float32")
        lengths = paddle.zeros([B], dtype="int64")
        use_penalty = p.repetition_penalty != 1.0
        presence = prompt_presence(input_ids, attention_mask, W.vocab_size) if use_penalty else paddle.zeros([1, 1], "uint8")
        uniforms = step_uniforms(draw, N, B, place) if p.do_sample else paddle.zeros([N, B], dtype="float32")
        flat_seqs = [t for s in stop_seqs for t in s]
        seq_lens = [len(s) for s in stop_seqs]

        self._routing = RoutingRecord(B, Tp + N) if self.record_routing else None
        logits = self._forward(W, cache, input_ids, pos_prefill, key_mask, finished, 0, prefill=True)
        logits_cols = False
        t_prefill = time.perf_counter() - t_start
        decode_steps = 0
        for step in range(N):
            suppress = stop_ids if step < p.min_new_tokens else []
            tok, lp = ops.sample(logits, presence, rows, uniforms, finished, step, p.temperature, p.top_k, p.top_p,
                                 p.repetition_penalty, p.do_sample, self.pad_token_id, suppress, logits_cols)
            n_active = (ops.update(tok, lp, rows, finished, pos, out_tokens, out_logprobs, lengths, presence,
                                      step, p.min_new_tokens, stop_ids, flat_seqs, seq_lens, use_penalty).item())
            if n_active == 0 or step == N - 1:
                break
            b_cur = rows.shape[0]
            if n_active <= self.compact_ratio * b_cur and N - 1 - step >= 4:
                keep = paddle.nonzero(finished == 0).reshape([-1])
                cache["k"] = paddle.index_select(cache["k"], keep, axis=1)
                cache["v"] = paddle.index_select(cache["v"], keep, axis=1)
                rows = paddle.index_select(rows, keep)
                finished = paddle.index_select(finished, keep)
                pos = paddle.index_select(pos, keep)
                key_mask = paddle.index_select(key_mask, keep)
                tok = paddle.index_select(tok, keep)
            logits = self._forward(W, cache, tok, pos, key_mask, finished, Tp + step, prefill=False, rows=rows)
            logits_cols = W.transposed
            decode_steps += 1
        del cache
        res = self._finish(input_ids, attention_mask, out_tokens, out_logprobs, lengths, t_start, t_prefill,
                           decode_steps, match=not use_penalty)
        res.stats["weights"] = "tensor_parallel_slices" if W.shard is not None else "whole"
        return res

    def _finish(self, input_ids, attention_mask, out_tokens, out_logprobs, lengths, t_start, t_prefill, decode_steps,
                match):
        lens_np = lengths.numpy()
        Tr = max(int(lens_np.max()) if lens_np.size else 0, 1)
        response_ids = out_tokens[:, :Tr]
        response_logprobs = out_logprobs[:, :Tr]
        response_mask = (paddle.arange(Tr, dtype="int64").unsqueeze(0) < lengths.unsqueeze(1)).astype("float32")
        response_logprobs = response_logprobs * response_mask
        sequences = paddle.concat([input_ids, response_ids], axis=1)
        routing, self._routing = self._routing, None
        wall = time.perf_counter() - t_start
        ntok = int(lens_np.sum())
        stats = {
            "tokens": ntok,
            "decode_steps": decode_steps,
            "prefill_s": t_prefill,
            "wall_s": wall,
            "tokens_per_s": ntok / wall if wall > 0 else 0.0,
            "backend": self.backend,
        }
        return RolloutOutput(
            sequences=sequences,
            response_ids=response_ids,
            response_mask=response_mask,
            response_logprobs=response_logprobs,
            response_lengths=lengths,
            logprobs_match_forward=bool(match),
            stats=stats,
            attention_mask=paddle.concat([attention_mask, response_mask.astype("int64")], axis=1),
            expert_indices=None if routing is None else routing.result(sequences.shape[1]),
        )

    # ------------------------------------------------------------------ PaddleNLP path (use_rollout_engine=False)
    def _generate_paddlenlp(self, lm, input_ids, attention_mask, p, seed, stop_ids, stop_seqs):
        return generate_with_paddlenlp(self, lm, input_ids, attention_mask, p, seed, stop_ids, stop_seqs)
