"""Pure-Paddle twins of the custom ops in csrc/ (same inputs, same outputs, same in-place writes).

Used when the compiled library is absent, and by tests/test_ops_*.py as the reference each op
must match. Every function documents the exact semantics; the C++/CUDA kernels implement the
same contract. They run under `paddle.no_grad()` inside the engine.
"""
import paddle
import paddle.nn.functional as F

from .moe_mlp import moe_experts  # noqa: F401  (rollout_moe_experts' twin: grouped_dispatch of SwiGLU experts)

NEG_INF = float("-inf")


# Every op takes `cols`: False = one token per row ([..., H]); True = one token per COLUMN
# ([H, B], the transposed layout of the CPU decode path). The twins handle cols=True by
# transposing to rows and back.
def _t(x):
    return x.transpose([1, 0])


# --------------------------------------------------------------------------- RMSNorm
def rms_norm(x, weight, eps, cols=False):
    """(x * rsqrt(mean(x^2) + eps)) * weight per token, exactly PaddleNLP's LlamaRMSNorm (float32)."""
    if cols:
        return _t(rms_norm(_t(x), weight, eps))
    variance = x.pow(2).mean(-1, keepdim=True)
    return paddle.rsqrt(variance + eps) * x * weight


def add_rms_norm(x, residual, weight, eps, cols=False):
    """residual += x IN PLACE; returns (rms_norm(residual), residual)."""
    residual.add_(x)
    return rms_norm(residual, weight, eps, cols), residual


def swiglu(x, y=None, cols=False):
    """silu(gate) * up: gate/up = x and y, or the two halves of x (last axis; first axis when
    cols) -- PaddleNLP's swiglu."""
    if y is None and cols:
        half = x.shape[0] // 2
        return F.swiglu(x[:half], x[half:])
    return F.swiglu(x, y)


def pack_transposed(dst, xs):
    """dst[...] = concat([x.T for x in xs], axis=0) for 2-D xs [K, N_i]; dst [sum N_i, K]."""
    paddle.assign(paddle.concat([_t(x) for x in xs], axis=0), output=dst)
    return dst


# --------------------------------------------------------------------------- attention
def _split_qkv(x, nh, nkv, hd, layout):
    B, tq = x.shape[0], x.shape[1]
    if layout == 0:
        q = x[:, :, : nh * hd].reshape([B, tq, nh, hd])
        k = x[:, :, nh * hd : (nh + nkv) * hd].reshape([B, tq, nkv, hd])
        v = x[:, :, (nh + nkv) * hd :].reshape([B, tq, nkv, hd])
    else:  # PaddleNLP fuse_attention_qkv: per kv head [group q heads, k, v]
        grp = nh // nkv
        x5 = x.reshape([B, tq, nkv, grp + 2, hd])
        q = x5[:, :, :, :grp].reshape([B, tq, nh, hd])
        k = x5[:, :, :, grp]
        v = x5[:, :, :, grp + 1]
    return q, k, v


def _rope(t, cos, sin):
    h = t.shape[-1] // 2
    rot = paddle.concat([-t[..., h:], t[..., :h]], axis=-1)
    return t * cos + rot * sin


def attention(qkv, k_cache, v_cache, cos, sin, pos, key_mask, finished, layer, t0, num_heads, num_kv_heads,
              head_dim, layout, scale, bias=None, cols=False):
    """RoPE + in-place KV-cache write + masked attention for one layer (see csrc/cpu/attention.cc).

    qkv [B, Tq, W] or [B, W]; k_cache [L, B, nkv, hd, S] (keys transposed), v_cache
    [L, B, nkv, S, hd]: slots t0..t0+Tq-1 of `layer` are written for unfinished rows; cos/sin
    [P, hd]; pos [B, Tq] or [B] int64; key_mask [B, Tp] int32 (slots >= Tp always valid);
    finished [B] int32; bias optional [W] added to q/k/v first. Returns [B, Tq, nh*hd] (or
    [B, nh*hd]); with cols=True qkv is [W, B] and the result [nh*hd, B].
    """
    if cols:
        out = attention(_t(qkv), k_cache, v_cache, cos, sin, pos, key_mask, finished, layer, t0, num_heads,
                        num_kv_heads, head_dim, layout, scale, bias, cols=False)
        return _t(out)
    if bias is not None:
        qkv = qkv + bias
    nh, nkv, hd = num_heads, num_kv_heads, head_dim
    two_d = len(qkv.shape) == 2
    B = qkv.shape[0]
    tq = 1 if two_d else qkv.shape[1]
    x = qkv.reshape([B, tq, qkv.shape[-1]])
    q, k, v = _split_qkv(x, nh, nkv, hd, layout)
    P = cos.shape[0]
    p = pos.reshape([B, tq]).clip(0, P - 1)
    c = paddle.gather(cos, p.reshape([-1])).reshape([B, tq, 1, hd])
    s = paddle.gather(sin, p.reshape([-1])).reshape([B, tq, 1, hd])
    q = _rope(q, c, s) * scale
    k = _rope(k, c, s)
    live = (finished == 0).reshape([B, 1, 1, 1])
    k_new = k.transpose([0, 2, 3, 1])  # [B, nkv, hd, tq]
    v_new = v.transpose([0, 2, 1, 3])  # [B, nkv, tq, hd]
    k_cache[layer, :, :, :, t0 : t0 + tq] = paddle.where(live, k_new, k_cache[layer, :, :, :, t0 : t0 + tq])
    v_cache[layer, :, :, t0 : t0 + tq] = paddle.where(live, v_new, v_cache[layer, :, :, t0 : t0 + tq])

    limit = t0 + tq
    K = k_cache[layer, :, :, :, :limit]  # [B, nkv, hd, limit]
    V = v_cache[layer, :, :, :limit]  # [B, nkv, limit, hd]
    if nh != nkv:
        K = paddle.repeat_interleave(K, nh // nkv, axis=1)
        V = paddle.repeat_interleave(V, nh // nkv, axis=1)
    scores = paddle.matmul(q.transpose([0, 2, 1, 3]), K)  # [B, nh, tq, limit]
    Tp = key_mask.shape[1]
    km = key_mask.astype("bool")
    if limit > Tp:
        km = paddle.concat([km, paddle.ones([B, limit - Tp], dtype="bool")], axis=1)
    else:
        km = km[:, :limit]
    causal = paddle.arange(limit).unsqueeze(0) <= (t0 + paddle.arange(tq)).unsqueeze(1)  # [tq, limit]
    valid = km.unsqueeze(1).unsqueeze(1) & causal.unsqueeze(0).unsqueeze(0)
    scores = paddle.where(valid, scores, paddle.full_like(scores, NEG_INF))
    any_valid = valid.any(axis=-1, keepdim=True)
    scores = paddle.where(any_valid, scores, paddle.zeros_like(scores))
    probs = F.softmax(scores, axis=-1)
    probs = paddle.where(any_valid, probs, paddle.zeros_like(probs))
    out = paddle.matmul(probs, V).transpose([0, 2, 1, 3])  # [B, tq, nh, hd]
    out = paddle.where(live, out, paddle.zeros_like(out)).reshape([B, tq, nh * hd])
    return out.reshape([B, nh * hd]) if two_d else out


# --------------------------------------------------------------------------- sampling
def sample(logits, presence, rows, uniforms, finished, step, temperature, top_k, top_p, penalty, do_sample, pad_id,
           suppress, cols=False):
    """One sampling step with log-prob output (see csrc/cpu/sampling.cc for the contract).

    Returns (tokens [B] int64, logprobs [B] float32); logprobs = log_softmax(logits / T)[token]
    of the raw logits; finished rows give (pad_id, 0). cols=True: logits are [V, B].
    """
    if cols:
        logits = _t(logits)
    B, V = logits.shape
    scaled_raw = logits / temperature
    lse = paddle.logsumexp(scaled_raw, axis=-1)
    work = logits
    if penalty != 1.0:
        seen = paddle.index_select(presence.astype("int32"), rows).astype("bool")
        pen = paddle.where(work > 0, work / penalty, work * penalty)
        work = paddle.where(seen, pen, work)
    sup = [s for s in suppress if 0 <= s < V]
    if sup:
        m = paddle.zeros([V], dtype="bool")
        m[paddle.to_tensor(sup, dtype="int64")] = True
        work = paddle.where(m.unsqueeze(0), paddle.full_like(work, NEG_INF), work)
    if not do_sample:
        tok = paddle.argmax(work, axis=-1)
    else:
        probs = F.softmax(work / temperature, axis=-1)
        u = paddle.gather(uniforms[step], rows)  # [B]
        filt = (0 < top_k < V) or top_p < 1.0
        if not filt:
            c = paddle.cumsum(probs, axis=-1)
            target = u * c[:, -1]
            pick = (c <= target.unsqueeze(1)).astype("int64").sum(-1).clip(max=V - 1)
            tok = pick
        else:
            K = top_k if 0 < top_k < V else V
            order = paddle.argsort(probs, axis=-1, descending=True, stable=True)
            sp = paddle.take_along_axis(probs, order, axis=-1)
            rank = paddle.arange(V).unsqueeze(0)
            sp = paddle.where(rank < K, sp, paddle.zeros_like(sp))
            q = sp / sp[:, :K].sum(-1, keepdim=True)
            if top_p < 1.0:
                before = paddle.cumsum(q, axis=-1) - q
                keep = (before < top_p) | (rank == 0)
                q = paddle.where(keep, q, paddle.zeros_like(q))
            c = paddle.cumsum(q, axis=-1)
            target = u * c[:, -1]
            pick = (c <= target.unsqueeze(1)).astype("int64").sum(-1)
            nkept = (q > 0).astype("int64").sum(-1)
            pick = paddle.minimum(pick, (nkept - 1).clip(min=0))
            tok = paddle.take_along_axis(order, pick.unsqueeze(1), axis=-1).squeeze(1)
    lp = paddle.take_along_axis(scaled_raw, tok.unsqueeze(1), axis=-1).squeeze(1) - lse
    fin = finished.astype("bool")
    tok = paddle.where(fin, paddle.full_like(tok, pad_id), tok)
    lp = paddle.where(fin, paddle.zeros_like(lp), lp)
    return tok, lp


# --------------------------------------------------------------------------- bookkeeping
def update(tokens, logprobs, rows, finished, pos, out_tokens, out_logprobs, lengths, presence, step, min_new_tokens,
           stop_ids, stop_seqs, stop_seq_lens, update_presence):
    """In-place bookkeeping after sampling (see csrc/cpu/step_update.cc); returns num_active [1] int64."""
    live = finished == 0
    idx = paddle.nonzero(live).reshape([-1])
    if idx.shape[0] > 0:
        r = paddle.gather(rows, idx)
        tok = paddle.gather(tokens, idx)
        out_tokens[r, step] = tok
        out_logprobs[r, step] = paddle.gather(logprobs, idx)
        lengths[r] = paddle.full_like(r, step + 1)
        if update_presence:
            presence[r, tok] = paddle.ones_like(tok).astype(presence.dtype)
        pos.add_(live.astype(pos.dtype).reshape(pos.shape))
        if step + 1 >= min_new_tokens:
            stop = paddle.zeros_like(tok, dtype="bool")
            for s in stop_ids:
                stop = stop | (tok == s)
            off = 0
            for ln in stop_seq_lens:
                if 0 < ln <= step + 1:
                    tail = out_tokens[:, step - ln + 1 : step + 1]
                    tail = paddle.gather(tail, r)
                    seq = paddle.to_tensor(stop_seqs[off : off + ln], dtype="int64").unsqueeze(0)
                    stop = stop | (tail == seq).all(axis=-1)
                off += ln
            new_fin = paddle.scatter(finished, idx, stop.astype(finished.dtype))
            new_fin = paddle.maximum(new_fin, finished)
            paddle.assign(new_fin, output=finished)
    return (finished == 0).astype("int64").sum().reshape([1])
