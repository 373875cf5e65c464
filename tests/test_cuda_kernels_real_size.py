"""The plain-CUDA kernels at real sizes, bf16, against float32 references computed on the GPU with
PyTorch (no Paddle): decode attention over >= 4k cached keys (head_dim 64 and 128, GQA 4 and 8,
split-K), prefill of >= 1k tokens with left padding, RMSNorm(+residual) and SwiGLU at 8k tokens,
and sampling over a 128,256-token vocabulary: the token checked against the contract's rule on
fixed uniforms (rows whose uniform sits within rounding of a boundary are the only ones allowed
to differ, and must be rare) and the distribution of many draws. Skips without a CUDA GPU,
PyTorch or nvcc, like tests/test_cuda_kernels.py."""
import ctypes
import math

import pytest

import cuda_ctypes
from test_cuda_kernels import _device, _nvcc

BF16 = cuda_ctypes.DTYPE["bfloat16"]


@pytest.fixture(scope="module")
def cu(tmp_path_factory):
    """(torch, {kernel file: ctypes library with typed launchers})."""
    dev, why = _device()
    if dev is None or dev.name != "torch":
        pytest.skip(why or "these tests build bf16 tensors with PyTorch")
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, $CUDA_HOME/bin, or `python csrc/check_cuda.py`'s cache)")
    out = str(tmp_path_factory.mktemp("cuda_real"))
    paths = cuda_ctypes.kernel_libraries(["attention", "sampling", "rms_norm", "swiglu"], out, dev.arch, nvcc)
    libs = {k: cuda_ctypes.load_all(p) for k, p in paths.items()}
    return dev.torch, libs


def _stream(torch):
    return torch.cuda.current_stream().cuda_stream


def _rope(torch, x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def _rope_tables(torch, P, hd):
    inv = 1.0 / 10000.0 ** (torch.arange(0, hd, 2, device="cuda", dtype=torch.float32) / hd)
    f = torch.outer(torch.arange(P, device="cuda", dtype=torch.float32), inv)
    emb = torch.cat([f, f], -1)
    return emb.cos().bfloat16(), emb.sin().bfloat16()


def _attention_reference(torch, q, k, v, allowed, scale):
    """q [B, nh, Tq, hd], k/v [B, nkv, n, hd] float32, allowed [B, Tq, n] bool -> [B, nh, Tq, hd]."""
    grp = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(grp, 1), v.repeat_interleave(grp, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a query with no allowed key gives zeros
    return p @ v


def _run_attention(torch, lib, qkv, kc, vc, cos, sin, pos, mask, fin, out, nh, nkv, hd, t0, cols):
    code = {torch.bfloat16: BF16, torch.float16: cuda_ctypes.DTYPE["float16"],
            torch.float32: cuda_ctypes.DTYPE["float32"]}[qkv.dtype]
    B = qkv.shape[-1] if cols else qkv.shape[0]
    Tq = qkv.shape[1] if qkv.dim() == 3 else 1
    ws_bytes = ctypes.c_int64(-1)
    assert lib.ppo_cuda_attention_workspace_bytes(code, B, Tq, nh, nkv, hd, t0, ctypes.byref(ws_bytes)) == 0
    ws = torch.empty(max(ws_bytes.value, 1), dtype=torch.uint8, device="cuda")
    st = lib.ppo_cuda_attention_ws(code, qkv.data_ptr(), None, kc.data_ptr(), vc.data_ptr(), cos.data_ptr(),
                                   sin.data_ptr(), pos.data_ptr(), mask.data_ptr(), fin.data_ptr(), out.data_ptr(), B,
                                   Tq, nh, nkv, hd, kc.shape[-1], mask.shape[1], cos.shape[0], 0, t0, 0,
                                   1.0 / math.sqrt(hd), int(cols), ws.data_ptr(), ws_bytes.value, _stream(torch))
    cuda_ctypes.expect_success(st, "attention")
    torch.cuda.synchronize()
    return ws_bytes.value


# S a multiple of 8: the 16-byte-load kernel; S = 4097: its scalar-load instantiation
@pytest.mark.parametrize("B,nh,nkv,hd,S,cols", [(4, 32, 8, 128, 4104, False), (3, 16, 2, 64, 5000, False),
                                                (5, 28, 4, 128, 4097, True)])
def test_decode_attention_real_size(cu, B, nh, nkv, hd, S, cols):
    """One new token per row over S - 1 cached keys: RoPE'd K/V written at slot S - 1, attention
    over every slot with left-padded prompt slots masked; a finished row gives zeros and leaves
    its cache alone."""
    torch, libs = cu
    g = torch.Generator(device="cuda").manual_seed(B * S)
    W, t0, Tp = (nh + 2 * nkv) * hd, S - 1, 64
    qkv = torch.randn(B, W, device="cuda", generator=g).bfloat16()
    kc = torch.randn(1, B, nkv, hd, S, device="cuda", generator=g).bfloat16()
    vc = torch.randn(1, B, nkv, S, hd, device="cuda", generator=g).bfloat16()
    cos, sin = _rope_tables(torch, S + 8, hd)
    mask = torch.ones(B, Tp, dtype=torch.int32, device="cuda")
    for b in range(B):
        mask[b, : 7 * b] = 0  # left padding of the prompt slots
    pos = torch.full((B, 1), t0, dtype=torch.int64, device="cuda") - (1 - mask).sum(1, keepdim=True)
    fin = torch.zeros(B, dtype=torch.int32, device="cuda")
    fin[1] = 1
    out = torch.full((nh * hd, B) if cols else (B, nh * hd), float("nan"), device="cuda").bfloat16()
    kc0 = kc.clone()
    x = qkv.t().contiguous() if cols else qkv
    ws = _run_attention(torch, libs["attention"], x, kc, vc, cos, sin, pos, mask, fin, out, nh, nkv, hd, t0, cols)
    if 2 * torch.cuda.get_device_properties(0).multi_processor_count > B * nkv:  # one block per KV group
        assert ws > 0  # a few rows over thousands of keys: the cache is split across blocks
    got = (out.t() if cols else out).float().reshape(B, nh, hd)
    c, s_ = cos[pos[:, 0]].float()[:, None], sin[pos[:, 0]].float()[:, None]
    qf = qkv.float()
    q = _rope(torch, qf[:, : nh * hd].view(B, nh, hd), c, s_)[:, :, None]
    k_new = _rope(torch, qf[:, nh * hd: (nh + nkv) * hd].view(B, nkv, hd), c, s_)
    live = fin == 0
    torch.testing.assert_close(kc[0, live, :, :, t0].float(), k_new[live].bfloat16().float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(kc[0, ~live], kc0[0, ~live])  # finished rows: cache untouched
    allowed = torch.ones(B, 1, S, dtype=torch.bool, device="cuda")
    allowed[:, 0, :Tp] = mask.bool()
    ref = _attention_reference(torch, q, kc[0].float().transpose(-1, -2), vc[0].float(), allowed, 1 / math.sqrt(hd))
    torch.testing.assert_close(got[live], ref[:, :, 0][live], atol=2e-2, rtol=2e-2)
    assert (got[~live] == 0).all()


@pytest.mark.parametrize("B,T,t0,nh,nkv,hd,dtype", [(2, 1024, 0, 32, 8, 128, "bfloat16"),
                                                    (2, 1030, 0, 16, 2, 64, "bfloat16"),
                                                    (3, 100, 300, 28, 4, 128, "bfloat16"),
                                                    (2, 1024, 0, 32, 8, 128, "float16")])
def test_prefill_attention_real_size(cu, B, T, t0, nh, nkv, hd, dtype):
    """T tokens written at slots t0.. and attended causally over the cache (t0 > 0: a chunked
    prefill after cached keys); left padding in the prompt slots, a partial last query tile."""
    torch, libs = cu
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(T + t0)
    W, n = (nh + 2 * nkv) * hd, t0 + T
    qkv = torch.randn(B, T, W, device="cuda", generator=g).to(dt)
    kc = torch.randn(1, B, nkv, hd, n, device="cuda", generator=g).to(dt)
    vc = torch.randn(1, B, nkv, n, hd, device="cuda", generator=g).to(dt)
    cos, sin = (t.to(dt) for t in _rope_tables(torch, n, hd))
    mask = torch.ones(B, n, dtype=torch.int32, device="cuda")  # key mask over every slot (Tp = n)
    mask[1, :100] = 0
    pos = ((mask.cumsum(1) - 1).clamp(min=0)[:, t0:]).contiguous()
    fin = torch.zeros(B, dtype=torch.int32, device="cuda")
    out = torch.empty(B, T, nh * hd, device="cuda").to(dt)
    _run_attention(torch, libs["attention"], qkv, kc, vc, cos, sin, pos, mask, fin, out, nh, nkv, hd, t0, False)
    c, s_ = cos[pos].float()[:, None], sin[pos].float()[:, None]  # [B, 1, T, hd]
    qf = qkv.float()
    q = _rope(torch, qf[..., : nh * hd].view(B, T, nh, hd).transpose(1, 2), c, s_)
    k = _rope(torch, qf[..., nh * hd: (nh + nkv) * hd].view(B, T, nkv, hd).transpose(1, 2), c, s_)
    v = qf[..., (nh + nkv) * hd:].view(B, T, nkv, hd).transpose(1, 2)
    k_all, v_all = kc[0].float().transpose(-1, -2), vc[0].float()  # [B, nkv, n, hd] after the write
    torch.testing.assert_close(k_all[:, :, t0:], k.to(dt).float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(v_all[:, :, t0:], v, atol=0, rtol=0)
    query_slot = torch.arange(t0, n, device="cuda")[:, None]
    allowed = (torch.arange(n, device="cuda")[None] <= query_slot)[None] & mask.bool()[:, None, :]
    ref = _attention_reference(torch, q, k_all, v_all, allowed, 1 / math.sqrt(hd))
    torch.testing.assert_close(out.float().view(B, T, nh, hd).transpose(1, 2), ref, atol=2e-2, rtol=2e-2)


# (Tq, t0, S, nh, nkv, hd, dtype): every attention path. bf16/fp16 with head_dim 64/128 and S a
# multiple of 8 run on tensor cores (few rows: 1-warp decode blocks; >= 64 (query, head) rows:
# 4-warp blocks); S = 517, head_dim 96 and float32 take the CUDA-core kernel (scalar and 16-byte loads).
NAN_PATHS = {
    "decode-tensor-cores": (1, 300, 512, 8, 2, 128, "bfloat16"),
    "decode-3-queries-hd64": (3, 200, 520, 14, 2, 64, "bfloat16"),
    "prefill-tensor-cores": (100, 0, 256, 8, 2, 128, "bfloat16"),
    "prefill-after-cache-fp16": (70, 90, 400, 8, 8, 64, "float16"),
    "decode-cuda-cores-odd-S": (1, 300, 517, 8, 2, 128, "bfloat16"),
    "prefill-cuda-cores-hd96": (40, 20, 200, 4, 2, 96, "bfloat16"),
    "decode-float32": (1, 250, 512, 8, 2, 64, "float32"),
    "prefill-float32": (40, 10, 128, 4, 1, 64, "float32"),
}


@pytest.mark.parametrize("path", sorted(NAN_PATHS))
def test_attention_ignores_nan_past_the_causal_end(cu, path):
    """The engine allocates its KV cache uninitialised: slots past the last written one may hold
    NaN. They lie inside the last key tile of a block, where a zero probability times a NaN value
    would poison the row; the output must equal the reference computed without them, finite."""
    torch, libs = cu
    Tq, t0, S, nh, nkv, hd, dtype = NAN_PATHS[path]
    dt, B = getattr(torch, dtype), 3
    g = torch.Generator(device="cuda").manual_seed(S + Tq)
    W, n = (nh + 2 * nkv) * hd, t0 + Tq
    qkv = torch.randn(B, Tq, W, device="cuda", generator=g).to(dt)
    kc = torch.randn(1, B, nkv, hd, S, device="cuda", generator=g).to(dt)
    vc = torch.randn(1, B, nkv, S, hd, device="cuda", generator=g).to(dt)
    kc[..., n:] = float("nan")  # never written: past the last query's slot
    vc[..., n:, :] = float("nan")
    cos, sin = (t.to(dt) for t in _rope_tables(torch, n, hd))
    mask = torch.ones(B, n, dtype=torch.int32, device="cuda")
    mask[2, : min(5, n - Tq)] = 0  # left padding
    pos = ((mask.cumsum(1) - 1).clamp(min=0)[:, t0:]).contiguous()
    fin = torch.zeros(B, dtype=torch.int32, device="cuda")
    out = torch.full((B, Tq, nh * hd), float("nan"), device="cuda").to(dt)
    _run_attention(torch, libs["attention"], qkv, kc, vc, cos, sin, pos, mask, fin, out, nh, nkv, hd, t0, False)
    assert torch.isfinite(out.float()).all(), f"{path}: NaN from the unwritten cache slots"
    c, s_ = cos[pos].float()[:, None], sin[pos].float()[:, None]
    q = _rope(torch, qkv.float()[..., : nh * hd].view(B, Tq, nh, hd).transpose(1, 2), c, s_)
    k_all = kc[0, :, :, :, :n].float().transpose(-1, -2)  # [B, nkv, n, hd]: the written slots only
    v_all = vc[0, :, :, :n].float()
    allowed = (torch.arange(n, device="cuda")[None] <= torch.arange(t0, n, device="cuda")[:, None])[None]
    ref = _attention_reference(torch, q, k_all, v_all, allowed & mask.bool()[:, None, :], 1 / math.sqrt(hd))
    tol = 1e-4 if dtype == "float32" else 2e-2
    torch.testing.assert_close(out.float().view(B, Tq, nh, hd).transpose(1, 2), ref, atol=tol, rtol=tol)


def test_rms_norm_and_swiglu_real_size(cu):
    torch, libs = cu
    F = torch.nn.functional
    tokens, H, I = 8192, 4096, 11008
    x = torch.randn(tokens, H, device="cuda").bfloat16()
    res = torch.randn(tokens, H, device="cuda").bfloat16()
    w = torch.randn(H, device="cuda").bfloat16()
    out = torch.empty_like(x)
    res0 = res.clone()
    st = libs["rms_norm"].ppo_cuda_rms_norm(BF16, x.data_ptr(), res.data_ptr(), w.data_ptr(), out.data_ptr(), tokens,
                                            H, 1e-6, 0, _stream(torch))
    cuda_ctypes.expect_success(st, "rms_norm")
    torch.cuda.synchronize()
    summed = (x.float() + res0.float()).bfloat16()
    assert torch.equal(res, summed)  # residual += x, rounded once
    ref = F.rms_norm(summed.float(), (H,), w.float(), 1e-6)
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=2e-2)
    xs = torch.randn(tokens, 2 * I, device="cuda").bfloat16()
    o = torch.empty(tokens, I, device="cuda").bfloat16()
    st = libs["swiglu"].ppo_cuda_swiglu(BF16, xs.data_ptr(), None, o.data_ptr(), tokens * I, I, 1, _stream(torch))
    cuda_ctypes.expect_success(st, "swiglu")
    torch.cuda.synchronize()
    gate, up = xs.float().chunk(2, -1)
    torch.testing.assert_close(o.float(), F.silu(gate) * up, atol=3e-2, rtol=2e-2)


def _sample(torch, lib, logits, presence, rows, uniforms, fin, *, T=1.0, top_k=0, top_p=1.0, penalty=1.0,
            do_sample=True, suppress=(), step=0):
    B, V = logits.shape
    tokens = torch.empty(B, dtype=torch.int64, device="cuda")
    lps = torch.empty(B, dtype=torch.float32, device="cuda")
    n_ws = lib.ppo_cuda_sample_workspace_bytes(B, V)
    ws = torch.empty(n_ws, dtype=torch.uint8, device="cuda")
    st = lib.ppo_cuda_sample_ws(BF16, logits.data_ptr(), presence.data_ptr(), rows.data_ptr(), uniforms.data_ptr(),
                                fin.data_ptr(), tokens.data_ptr(), lps.data_ptr(), B, V, uniforms.shape[1], step, T,
                                top_k, top_p, penalty, int(do_sample), 3, cuda_ctypes.host_int64(suppress),
                                len(suppress), 0, ws.data_ptr(), n_ws, _stream(torch))
    cuda_ctypes.expect_success(st, "sample")
    torch.cuda.synchronize()
    return tokens, lps


def _rule(torch, work_row, u, T, top_k, top_p, eps=2e-6):
    """The contract's token for one row (float64), and whether u, or top_p, lies within eps of
    one of the boundaries that decide it (where float rounding may pick the neighbour)."""
    p = torch.softmax(work_row.double() / T, -1)
    V = p.numel()
    near = False
    if (0 < top_k < V) or top_p < 1.0:
        p, ids = torch.sort(p, descending=True, stable=True)  # ties: lower id first
        K = top_k if 0 < top_k < V else V
        p, ids = p[:K] / p[:K].sum(), ids[:K]
        if top_p < 1.0:
            before = p.cumsum(0) - p
            n = int((before < top_p).sum().clamp(min=1))
            near = bool(((before[max(n - 1, 0): n + 1] - top_p).abs() < eps).any())
            p, ids = p[:n], ids[:n]
    else:
        ids = torch.arange(V, device=p.device)
    cum = p.cumsum(0) / p.sum()
    i = int(torch.searchsorted(cum, torch.tensor([u], dtype=cum.dtype, device=cum.device), right=True).clamp(
        max=len(ids) - 1))
    near = near or bool(((cum[max(i - 1, 0): i + 1] - u).abs() < eps).any())
    return int(ids[i]), near


@pytest.mark.parametrize("mode", ["greedy", "plain", "top_k", "top_p", "top_k_top_p_penalty"])
def test_sampling_128k_vocab_follows_the_rule(cu, mode):
    torch, libs = cu
    B, B0, V = 24, 32, 128256
    g = torch.Generator(device="cuda").manual_seed(7)
    logits = (torch.randn(B, V, device="cuda", generator=g) * 3).bfloat16()
    presence = (torch.rand(B0, V, device="cuda", generator=g) < 0.01).to(torch.uint8)
    rows = torch.randperm(B0, device="cuda", generator=g)[:B].contiguous()
    uniforms = torch.rand(2, B0, device="cuda", generator=g)
    fin = torch.zeros(B, dtype=torch.int32, device="cuda")
    fin[5] = 1
    kw = dict(greedy=dict(do_sample=False, penalty=1.2, suppress=(11,)), plain=dict(T=0.8, suppress=(11, 12)),
              top_k=dict(top_k=50), top_p=dict(top_p=0.9, T=1.1),
              top_k_top_p_penalty=dict(top_k=2000, top_p=0.7, penalty=1.3))[mode]
    tokens, lps = _sample(torch, libs["sampling"], logits, presence, rows, uniforms, fin, step=1, **kw)
    T = kw.get("T", 1.0)
    raw = logits.float()
    work = raw.clone()
    if kw.get("penalty", 1.0) != 1.0:
        seen = presence[rows].bool()
        work = torch.where(seen, torch.where(work > 0, work / kw["penalty"], work * kw["penalty"]), work)
    work[:, list(kw.get("suppress", ()))] = float("-inf")
    assert tokens[5].item() == 3 and lps[5].item() == 0.0  # finished row: pad id, log-prob 0
    live = [b for b in range(B) if b != 5]
    ref_lp = torch.log_softmax(raw / T, -1).gather(1, tokens.view(-1, 1)).squeeze(1)
    torch.testing.assert_close(lps[live], ref_lp[live], atol=1e-3, rtol=1e-4)  # raw log-prob at temperature
    if mode == "greedy":
        assert torch.equal(tokens[live], work[live].argmax(-1))
        return
    differ, near_differ = [], 0  # a row whose uniform or top_p lies within rounding of a boundary may differ
    for b in live:
        want, near = _rule(torch, work[b], uniforms[1, rows[b]].item(), T, kw.get("top_k", 0), kw.get("top_p", 1.0))
        if tokens[b].item() != want:
            near_differ += near
            if not near:
                differ.append((b, tokens[b].item(), want))
    assert not differ, differ
    assert near_differ <= 2


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (40, 1.0), (0, 0.8)])
def test_sampling_distribution_of_many_draws(cu, top_k, top_p):
    """4096 rows with the same logits and independent uniforms are 4096 draws: the kept tokens
    grouped into 20 bins of about equal probability, each bin's frequency within 5 standard
    errors of its probability, and no token outside the kept set."""
    torch, libs = cu
    B, V, n_bins = 4096, 3000, 20
    g = torch.Generator(device="cuda").manual_seed(top_k + 1)
    row = (torch.randn(V, device="cuda", generator=g) * 2).bfloat16()
    logits = row.expand(B, V).contiguous()
    presence = torch.zeros(1, 1, dtype=torch.uint8, device="cuda")
    rows = torch.arange(B, device="cuda")
    uniforms = torch.rand(1, B, device="cuda", generator=g)
    fin = torch.zeros(B, dtype=torch.int32, device="cuda")
    tokens, _ = _sample(torch, libs["sampling"], logits, presence, rows, uniforms, fin, top_k=top_k, top_p=top_p)
    sp, ids = torch.sort(torch.softmax(row.double(), -1), descending=True, stable=True)
    K = top_k or V
    sp, ids = sp[:K] / sp[:K].sum(), ids[:K]
    n = int(((sp.cumsum(0) - sp) < top_p).sum().clamp(min=1)) if top_p < 1.0 else K
    want = torch.zeros(V, dtype=torch.float64, device="cuda")
    want[ids[:n]] = sp[:n] / sp[:n].sum()
    counts = torch.bincount(tokens, minlength=V).double() / B
    assert (counts[want == 0] == 0).all()  # never a token outside the kept set
    order = torch.argsort(want, descending=True, stable=True)
    bin_of = torch.empty(V, dtype=torch.long, device="cuda")
    bin_of[order] = ((want[order].cumsum(0) - want[order]) * n_bins).long().clamp(max=n_bins - 1)
    expected = torch.zeros(n_bins, dtype=torch.float64, device="cuda").index_add_(0, bin_of, want)
    observed = torch.zeros(n_bins, dtype=torch.float64, device="cuda").index_add_(0, bin_of, counts)
    se = (expected * (1 - expected) / B).sqrt()
    assert ((observed - expected).abs() <= 5 * se + 1e-3).all(), (observed, expected)
