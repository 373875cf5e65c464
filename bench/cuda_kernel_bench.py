"""Times the plain-CUDA rollout kernels (csrc/cuda/*.cu) against PyTorch's own ops on a GPU.

Needs a CUDA GPU, PyTorch and nvcc (on PATH, in $CUDA_HOME/bin, or the cache that
`python csrc/check_cuda.py` fills); Paddle is not needed. From the repository root:

    python bench/cuda_kernel_bench.py --out cuda_kernel_bench.json

Each kernel file is built with nvcc for this GPU and its extern "C" launcher (csrc/cuda/ppo_cuda.h)
is called through ctypes on PyTorch tensors. For every shape: the largest error against a float32
PyTorch reference, our time and PyTorch's on the same tensors (CUDA events, median of --iters after
warm-up), their ratio, and the ratio to the HBM bound (bytes that must move / --bw). bf16 throughout.
Ratios are comparable only within one run on one card; the JSON names the card.
"""
import argparse
import concurrent.futures
import ctypes
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P, I64, INT, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
BF16 = 2  # PPO_CUDA_BFLOAT16
ATTENTION_ARGS = [INT, P, P, P, P, P, P, P, P, P, P] + [I64] * 11 + [F32, INT]
SAMPLE_ARGS = [INT, P, P, P, P, P, P, P, I64, I64, I64, I64, F32, I64, F32, F32, INT, I64, P, I64, INT]
SIGNATURES = {
    "ppo_cuda_attention_ws": ATTENTION_ARGS + [P, I64, P],
    "ppo_cuda_attention_workspace_bytes": [INT, I64, I64, I64, I64, I64, I64, P],
    "ppo_cuda_sample_ws": SAMPLE_ARGS + [P, I64, P],
    "ppo_cuda_sample_workspace_bytes": [I64, I64],
    "ppo_cuda_rms_norm": [INT, P, P, P, P, I64, I64, F32, INT, P],
    "ppo_cuda_swiglu": [INT, P, P, P, I64, I64, INT, P],
}
GRAPH = False  # --graph: decode calls are also captured in a CUDA graph and replayed
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}


def _check_cuda():
    spec = importlib.util.spec_from_file_location("_check_cuda", os.path.join(REPO, "csrc", "check_cuda.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def find_nvcc(check):
    found = shutil.which("nvcc")
    if not found and os.environ.get("CUDA_HOME"):
        found = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
    if not found:
        tools = check.find_ready_tools()
        found = check.nvcc_path(tools) if tools else None
    if not found or not os.access(found, os.X_OK):
        sys.exit("nvcc not found (PATH, $CUDA_HOME/bin, or `python csrc/check_cuda.py`'s cache)")
    return found


def build(check, nvcc, kernel, out_dir, extra=(), tag=""):
    """The kernel file's shared library, its launchers typed from SIGNATURES (a plain library from
    `$PPO_CUDA_LIBDIR` when a GPU check script built it there)."""
    arch = "%d%d" % torch.cuda.get_device_capability()
    path = os.path.join(os.environ.get("PPO_CUDA_LIBDIR", "-"), f"lib{kernel}_sm{arch}.so")
    if tag or not os.path.exists(path):
        path = check.build_kernel_library(os.path.join(REPO, "csrc", "cuda", f"{kernel}.cu"), out_dir, arch, nvcc=nvcc,
                                          werror=False, extra=extra, tag=tag)
    lib = ctypes.CDLL(path)
    for name, args in SIGNATURES.items():
        if hasattr(lib, name):
            getattr(lib, name).argtypes = args
            # ppo_cuda_sample_workspace_bytes returns the size; every other launcher a status code
            getattr(lib, name).restype = ctypes.c_int64 if name == "ppo_cuda_sample_workspace_bytes" else ctypes.c_int
    return lib


# Builds of a kernel file with other tuning macros (csrc/cuda/attention_mma.cuh, sampling_parts.cuh),
# timed beside the default on that kernel's shapes: name -> (kernel file, nvcc flags).
VARIANTS = {
    "cuda_cores": ("attention", ["-DPPO_ATTENTION_NO_MMA"]),
    "stages3": ("attention", ["-DPPO_MMA_NST_DECODE=3", "-DPPO_MMA_NST_PREFILL=3"]),
    "decode_blocks_per_sm3": ("attention", ["-DPPO_MMA_DECODE_BLOCKS_PER_SM=3"]),
    "decode_blocks_per_sm12": ("attention", ["-DPPO_MMA_DECODE_BLOCKS_PER_SM=12"]),
    "ahead1": ("attention", ["-DPPO_MMA_AHEAD=1"]),
    "sample_chunk2k": ("sampling", ["-DPPO_SAMPLE_CHUNK_TARGET=2048"]),
    "sample_chunk8k": ("sampling", ["-DPPO_SAMPLE_CHUNK_TARGET=8192"]),
    "sample_unroll4": ("sampling", ["-DPPO_SAMPLE_UNROLL=4"]),
    "sample_chunk16k_unroll8": ("sampling", ["-DPPO_SAMPLE_CHUNK_TARGET=16384", "-DPPO_SAMPLE_UNROLL=8"]),
}
SAMPLE_SHAPES = [(64, 128256), (256, 151936)]
DECODE_SHAPES = [(32, 32, 8, 128, 2048), (64, 14, 2, 64, 2048), (8, 64, 8, 128, 8192), (128, 32, 8, 128, 1024)]
PREFILL_SHAPES = [(8, 32, 8, 128, 1024), (4, 28, 4, 128, 2048)]


def timeit(fn, iters, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


def compare(ours, theirs, bound=None, **extra):
    row = {"ours_s": ours, "torch_s": theirs, "ours_over_torch": ours / theirs, **extra}
    if bound:
        row.update(bound_s=bound, ours_over_bound=ours / bound)
    return row


def _stream():
    return torch.cuda.current_stream().cuda_stream


def attention_call(lib, qkv, kc, vc, cos, sin, pos, mask, fin, out, B, Tq, nh, nkv, hd, t0, scale):
    S, Tp, Pn = kc.shape[-1], mask.shape[1], cos.shape[0]
    ws_bytes = ctypes.c_int64(0)
    assert lib.ppo_cuda_attention_workspace_bytes(BF16, B, Tq, nh, nkv, hd, t0, ctypes.byref(ws_bytes)) == 0
    ws = torch.empty(max(ws_bytes.value, 1), dtype=torch.uint8, device="cuda")
    args = (BF16, qkv.data_ptr(), None, kc.data_ptr(), vc.data_ptr(), cos.data_ptr(), sin.data_ptr(), pos.data_ptr(),
            mask.data_ptr(), fin.data_ptr(), out.data_ptr(), B, Tq, nh, nkv, hd, S, Tp, Pn, 0, t0, 0, scale, 0,
            ws.data_ptr(), ws_bytes.value)

    def call():
        return lib.ppo_cuda_attention_ws(*args, _stream())
    # The call holds the workspace tensor, not only its address: a dropped `ws` goes back to PyTorch's
    # caching allocator (other tensors reuse it), and `torch.cuda.graph` empties that cache before it
    # captures, so a replay wrote freed memory (the "illegal address" of the graph step).
    call.workspace = ws
    return call


def bench_decode(lib, B, nh, nkv, hd, n_ctx, bw, iters):
    """One new token per row over n_ctx cached keys (the last slot is written by the call)."""
    dt, dev = torch.bfloat16, "cuda"
    W = (nh + 2 * nkv) * hd
    qkv = torch.randn(B, W, device=dev, dtype=dt)
    kc = torch.randn(1, B, nkv, hd, n_ctx, device=dev, dtype=dt)
    vc = torch.randn(1, B, nkv, n_ctx, hd, device=dev, dtype=dt)
    cos = torch.ones(n_ctx + 1, hd, device=dev, dtype=dt)
    sin = torch.zeros(n_ctx + 1, hd, device=dev, dtype=dt)
    pos = torch.full((B, 1), n_ctx - 1, device=dev, dtype=torch.int64)
    mask = torch.ones(B, 16, device=dev, dtype=torch.int32)
    fin = torch.zeros(B, device=dev, dtype=torch.int32)
    out = torch.empty(B, nh * hd, device=dev, dtype=dt)
    scale = 1 / math.sqrt(hd)
    call = attention_call(lib, qkv, kc, vc, cos, sin, pos, mask, fin, out, B, 1, nh, nkv, hd, n_ctx - 1, scale)
    assert call() == 0
    torch.cuda.synchronize()
    q = qkv[:, : nh * hd].reshape(B, nh, 1, hd)
    k = kc[0].transpose(-1, -2).contiguous()  # [B, nkv, n, hd], after the call wrote the last slot
    v = vc[0].contiguous()
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(nh // nkv, 1),
                                         v.float().repeat_interleave(nh // nkv, 1), scale=scale)
    err = (out.float().view(B, nh, hd) - ref.view(B, nh, hd)).abs().max().item()
    theirs = timeit(lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True), iters)
    bound = 2 * B * nkv * n_ctx * hd * 2 / bw
    return {"shape": dict(B=B, nh=nh, nkv=nkv, hd=hd, n_ctx=n_ctx), "max_abs_err_vs_fp32": err,
            **compare(timeit(call, iters), theirs, bound, torch_op="sdpa enable_gqa"),
            **({"graph_replay_s": graph_time(call, iters)} if GRAPH else {})}


def graph_time(call, iters):
    """Median time of `call` (its three launches: K/V write, attention, merge) captured in a CUDA
    graph and replayed: what the launches cost once a decode step is captured; None if capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()  # warm-up outside the capture (first-use driver work)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            assert call() == 0
        return timeit(graph.replay, iters)
    except Exception as e:  # noqa: BLE001 - reported in the JSON, the bench goes on
        return f"capture failed: {e}"


def bench_prefill(lib, B, nh, nkv, hd, T, iters):
    """T prompt tokens per row written into the cache and attended causally (t0 = 0)."""
    dt, dev = torch.bfloat16, "cuda"
    W = (nh + 2 * nkv) * hd
    qkv = torch.randn(B, T, W, device=dev, dtype=dt)
    kc = torch.zeros(1, B, nkv, hd, T, device=dev, dtype=dt)
    vc = torch.zeros(1, B, nkv, T, hd, device=dev, dtype=dt)
    cos = torch.ones(T, hd, device=dev, dtype=dt)
    sin = torch.zeros(T, hd, device=dev, dtype=dt)
    pos = torch.arange(T, device=dev, dtype=torch.int64).repeat(B, 1)
    mask = torch.ones(B, T, device=dev, dtype=torch.int32)
    fin = torch.zeros(B, device=dev, dtype=torch.int32)
    out = torch.empty(B, T, nh * hd, device=dev, dtype=dt)
    scale = 1 / math.sqrt(hd)
    call = attention_call(lib, qkv, kc, vc, cos, sin, pos, mask, fin, out, B, T, nh, nkv, hd, 0, scale)
    assert call() == 0
    torch.cuda.synchronize()
    q = qkv[..., : nh * hd].view(B, T, nh, hd).transpose(1, 2).contiguous()
    k = qkv[..., nh * hd: (nh + nkv) * hd].view(B, T, nkv, hd).transpose(1, 2).contiguous()
    v = qkv[..., (nh + nkv) * hd:].view(B, T, nkv, hd).transpose(1, 2).contiguous()
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(nh // nkv, 1),
                                         v.float().repeat_interleave(nh // nkv, 1), is_causal=True, scale=scale)
    err = (out.float().view(B, T, nh, hd).transpose(1, 2) - ref).abs().max().item()
    theirs = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True),
                    iters)
    ours = timeit(call, max(3, iters // 5), warm=1)
    flops = 2 * B * nh * T * T * hd  # causal: half of 4 * B * nh * T^2 * hd
    return {"shape": dict(B=B, nh=nh, nkv=nkv, hd=hd, T=T), "max_abs_err_vs_fp32": err,
            **compare(ours, theirs, None, torch_op="sdpa causal enable_gqa", ours_TFLOPs=flops / ours / 1e12,
                      torch_TFLOPs=flops / theirs / 1e12)}


def bench_rms(lib, tokens, H, add, bw, iters):
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(H, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    res0 = res.clone()
    call = lambda: lib.ppo_cuda_rms_norm(BF16, x.data_ptr(), res.data_ptr() if add else None, w.data_ptr(),
                                         out.data_ptr(), tokens, H, 1e-6, 0, _stream())
    assert call() == 0
    torch.cuda.synchronize()
    src = (x.float() + res0.float()).to(torch.bfloat16).float() if add else x.float()
    err = (out.float() - F.rms_norm(src, (H,), w.float(), 1e-6)).abs().max().item()
    if add:
        def theirs_fn():
            r = res0 + x
            return F.rms_norm(r, (H,), w, 1e-6)
    else:
        theirs_fn = lambda: F.rms_norm(x, (H,), w, 1e-6)
    n_bytes = x.numel() * 2 * (4 if add else 2)
    return {"shape": dict(tokens=tokens, H=H, residual_add=add), "max_abs_err_vs_fp32": err,
            **compare(timeit(call, iters), timeit(theirs_fn, iters), n_bytes / bw, torch_op="F.rms_norm")}


def bench_swiglu(lib, tokens, I, bw, iters):
    x = torch.randn(tokens, 2 * I, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(tokens, I, device="cuda", dtype=torch.bfloat16)
    call = lambda: lib.ppo_cuda_swiglu(BF16, x.data_ptr(), None, out.data_ptr(), tokens * I, I, 1, _stream())
    assert call() == 0
    torch.cuda.synchronize()
    g, u = x.float().chunk(2, -1)
    err = (out.float() - F.silu(g) * u).abs().max().item()
    theirs_fn = lambda: F.silu(x[:, :I]) * x[:, I:]
    return {"shape": dict(tokens=tokens, I=I), "max_abs_err_vs_fp32": err,
            **compare(timeit(call, iters), timeit(theirs_fn, iters), 3 * tokens * I * 2 / bw,
                      torch_op="F.silu(gate) * up")}


def torch_sampler(logits, mode, top_k, top_p):
    """PyTorch's way of the same draw on the same logits (what a generate loop does)."""
    if mode == "greedy":
        return lambda: logits.argmax(-1)
    if mode == "plain":
        return lambda: torch.multinomial(torch.softmax(logits.float(), -1), 1)
    if mode == "top_k":
        def fn():
            vals, idx = logits.float().topk(top_k, -1)
            return idx.gather(1, torch.multinomial(torch.softmax(vals, -1), 1))
        return fn

    def fn():
        probs, idx = torch.softmax(logits.float(), -1).sort(-1, descending=True)
        probs[(probs.cumsum(-1) - probs) >= top_p] = 0
        return idx.gather(1, torch.multinomial(probs, 1))
    return fn


def bench_sample(lib, B, V, bw, iters):
    logits = (torch.randn(B, V, device="cuda") * 3).to(torch.bfloat16)
    rows = torch.arange(B, device="cuda", dtype=torch.int64)
    uni = torch.rand(1, B, device="cuda")
    fin = torch.zeros(B, device="cuda", dtype=torch.int32)
    tok = torch.empty(B, device="cuda", dtype=torch.int64)
    lp = torch.empty(B, device="cuda")
    ws_bytes = lib.ppo_cuda_sample_workspace_bytes(B, V)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
    ref_lp = torch.log_softmax(logits.float(), -1)
    res = {"shape": dict(B=B, V=V)}
    for name, mode, do_sample, top_k, top_p in (("greedy", "greedy", 0, 0, 1.0), ("plain", "plain", 1, 0, 1.0),
                                                ("top_k50", "top_k", 1, 50, 1.0), ("top_p0.9", "top_p", 1, 0, 0.9)):
        args = (BF16, logits.data_ptr(), None, rows.data_ptr(), uni.data_ptr(), fin.data_ptr(), tok.data_ptr(),
                lp.data_ptr(), B, V, B, 0, 1.0, top_k, top_p, 1.0, do_sample, 0, None, 0, 0, ws.data_ptr(), ws_bytes)
        call = lambda: lib.ppo_cuda_sample_ws(*args, _stream())
        assert call() == 0, name
        torch.cuda.synchronize()
        lp_err = (ref_lp.gather(1, tok.view(-1, 1)).squeeze(1) - lp).abs().max().item()
        row = {"logprob_err": lp_err}
        if mode == "greedy":
            row["equals_argmax"] = bool((tok == logits.float().argmax(-1)).all())
        res[name] = {**row, **compare(timeit(call, iters), timeit(torch_sampler(logits, mode, top_k, top_p), iters),
                                      B * V * 2 / bw)}
    return res


def _row_line(kernel, row):
    shape = ",".join(f"{k}{v}" for k, v in row.get("shape", {}).items())
    err = row.get("max_abs_err_vs_fp32", row.get("logprob_err", float("nan")))
    bound = f" bound x{row['ours_over_bound']:.2f}" if "ours_over_bound" in row else ""
    if isinstance(row.get("graph_replay_s"), float):
        bound += f" graph {row['graph_replay_s'] * 1e6:.1f} us"
    elif "graph_replay_s" in row:
        bound += f" graph: {row['graph_replay_s']}"
    tf = f" {row['ours_TFLOPs']:.0f}/{row['torch_TFLOPs']:.0f} TFLOP/s" if "ours_TFLOPs" in row else ""
    if "equals_argmax" in row:
        tf += " = argmax" if row["equals_argmax"] else " != ARGMAX"
    return (f"{kernel:<26} {shape:<34} ours {row['ours_s'] * 1e6:9.1f} us  torch {row['torch_s'] * 1e6:9.1f} us  "
            f"x{row['ours_over_torch']:.2f}{bound}{tf} err {err:.2g}")


def table_lines(res):
    """One line per kernel and shape: times, ours / torch, ours / HBM bound, error."""
    lines = [f"{res['device']}, torch {res['torch']}, {res['dtype']}"]
    for kernel in ("attention_decode", "attention_prefill", "rms_norm", "swiglu"):
        lines += [_row_line(kernel, row) for row in res.get(kernel, [])]
    for entry in res.get("sample", []):
        for mode, row in entry.items():
            if mode != "shape":
                lines.append(_row_line(f"sample_{mode}", dict(row, shape=entry["shape"])))
    for v, got in res.get("variants", {}).items():
        lines += [_row_line(f"{v}:{k}", row) for k in ("decode", "prefill") for row in got.get(k, [])]
        for entry in got.get("sample", []):
            lines += [_row_line(f"{v}:sample_{mode}", dict(row, shape=entry["shape"]))
                      for mode, row in entry.items() if mode != "shape"]
    return lines


def bench_variant(name, lib, bw, iters):
    """The shapes of the variant's kernel file, timed with its build."""
    kernel, flags = VARIANTS[name]
    if kernel == "sampling":
        return {"kernel": kernel, "flags": flags, "sample": [bench_sample(lib, B, V, bw, iters) for B, V in SAMPLE_SHAPES]}
    return {"kernel": kernel, "flags": flags, "decode": [bench_decode(lib, *s, bw, iters) for s in DECODE_SHAPES],
            "prefill": [bench_prefill(lib, *s, iters) for s in PREFILL_SHAPES]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--bw", type=float, default=None, help="HBM bytes/s (default: from the card's name)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--graph", action="store_true",
                    help="only the decode shapes, each also captured in a CUDA graph and replayed")
    ap.add_argument("--table", action="store_true", help="print one line per kernel and shape instead of the JSON")
    ap.add_argument("--variants", nargs="*", default=[], choices=sorted(VARIANTS),
                    help="also time these builds of a kernel file (tuning macros) on that kernel's shapes")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU")
    name = torch.cuda.get_device_name()
    bw = a.bw or next((v for k, v in HBM_BYTES_PER_S.items() if k in name), 3.35e12)
    check = _check_cuda()
    nvcc = find_nvcc(check)
    tmp = tempfile.mkdtemp(prefix="cuda-kernel-bench-")
    names = ("attention", "rms_norm", "swiglu", "sampling")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        libs = dict(zip(names, pool.map(lambda k: build(check, nvcc, k, tmp), names)))
        variants = dict(zip(a.variants, pool.map(
            lambda v: build(check, nvcc, VARIANTS[v][0], tmp, VARIANTS[v][1], "_" + v), a.variants)))
    res = {"device": name, "torch": torch.__version__, "hbm_bytes_per_s": bw, "dtype": "bfloat16"}
    global GRAPH
    GRAPH = a.graph
    res["attention_decode"] = [bench_decode(libs["attention"], *s, bw, a.iters) for s in DECODE_SHAPES]
    if a.graph:
        print(text_of(res, a))
        return
    res["attention_prefill"] = [bench_prefill(libs["attention"], *s, a.iters) for s in PREFILL_SHAPES]
    res["rms_norm"] = [bench_rms(libs["rms_norm"], t, H, add, bw, a.iters) for t, H, add in
                       [(64, 4096, False), (8192, 4096, False), (8192, 4096, True)]]
    res["swiglu"] = [bench_swiglu(libs["swiglu"], t, I, bw, a.iters) for t, I in [(64, 11008), (8192, 11008)]]
    res["sample"] = [bench_sample(libs["sampling"], B, V, bw, a.iters) for B, V in SAMPLE_SHAPES]
    res["variants"] = {v: bench_variant(v, lib, bw, a.iters) for v, lib in variants.items()}
    print(text_of(res, a))


def text_of(res, a):
    """The JSON (also written to --out), or the table with --table."""
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return text if not a.table else "\n".join(table_lines(res))


if __name__ == "__main__":
    main()
