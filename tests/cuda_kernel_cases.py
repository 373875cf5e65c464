"""Inputs and C++ CPU-kernel outputs for the CUDA kernel tests (tests/test_cuda_kernels.py).

A GPU machine may have nvcc and PyTorch/CuPy but no Paddle, so the reference outputs of the C++
CPU kernels (csrc/cpu/) are computed here, on the same random inputs, and stored in
tests/fixtures/cuda_kernel_cases.npz. tests/test_cuda_kernel_cases.py recomputes them with the
CPU kernels on every run (the file cannot go stale). Regenerate after changing a CPU kernel:

    python tests/cuda_kernel_cases.py

Inputs cover odd sizes, padding (masked prompt keys, a fully padded row), finished rows,
compacted batches (rows index a larger original batch), both layouts (rows / cols) and
out-of-range positions. Numpy only at import; Paddle only in `cpu_outputs`.
"""
import math
import os

import numpy as np

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "cuda_kernel_cases.npz")


def _rng(seed):
    return np.random.default_rng(seed)


def _coarse(x):
    """float32 random values on a 1/256 grid: same kernels exercised, a much smaller fixture file."""
    return (np.round(np.asarray(x) * 256) / 256).astype("float32")


def _rms_cases():
    out = []
    for name, shape, cols, add in (("rows_odd", (5, 37), False, False), ("rows_3d_add", (3, 2, 129), False, True),
                                   ("cols", (37, 6), True, False), ("cols_add", (1030, 3), True, True)):
        r = _rng(len(out) + 1)
        H = shape[0] if cols else shape[-1]
        inp = {"x": r.standard_normal(shape).astype("float32") * 2,
               "w": r.standard_normal(H).astype("float32")}
        if add:
            inp["residual"] = r.standard_normal(shape).astype("float32")
        out.append(dict(name=f"rms_norm_{name}", op="rms_norm", attrs=dict(eps=1e-6, cols=cols), inputs=inp))
    return out


def _swiglu_cases():
    out = []
    r = _rng(10)
    x = r.standard_normal((3, 2 * 37)).astype("float32") * 4
    x[0, :4] = [100.0, -100.0, 0.0, -30.0]
    out.append(dict(name="swiglu_fused", op="swiglu", attrs=dict(cols=False), inputs={"x": x}))
    out.append(dict(name="swiglu_separate", op="swiglu", attrs=dict(cols=False),
                    inputs={"x": r.standard_normal((7, 53)).astype("float32") * 3,
                            "y": r.standard_normal((7, 53)).astype("float32")}))
    out.append(dict(name="swiglu_cols", op="swiglu", attrs=dict(cols=True),
                    inputs={"x": r.standard_normal((2 * 19, 5)).astype("float32") * 3}))
    return out


def _pack_cases():
    out = []
    for K, Ns in ((13, [7, 33, 1]), (64, [40]), (5, [1, 2, 3])):
        r = _rng(K)
        inp = {f"x{i}": r.standard_normal((K, n)).astype("float32") for i, n in enumerate(Ns)}
        out.append(dict(name=f"pack_transposed_K{K}", op="pack_transposed", attrs=dict(n_inputs=len(Ns)), inputs=inp))
    return out


def _rope(P, hd, theta=10000.0):
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype="float32") / hd)
    f = np.outer(np.arange(P, dtype="float32"), inv)
    emb = np.concatenate([f, f], -1)
    return np.cos(emb).astype("float32"), np.sin(emb).astype("float32")


ATTENTION = [
    # name, B, Tq, Tp, t0, nh, nkv, hd, layout, finished, full_pad_row, bias, cols
    ("prefill_gqa_bias", 5, 7, 7, 0, 4, 2, 8, 0, (1,), 3, True, False),
    ("prefill_mha_odd", 3, 5, 5, 0, 2, 2, 6, 0, (), None, False, False),
    ("decode_mha", 6, 1, 5, 9, 4, 4, 16, 0, (2, 5), None, False, False),
    ("decode_fused_layout", 3, 1, 4, 6, 4, 2, 8, 1, (), None, False, False),
    ("prefill_fused_mqa", 3, 4, 4, 0, 4, 1, 8, 1, (2,), None, False, False),
    ("decode_cols_hd64", 5, 1, 5, 20, 4, 2, 64, 0, (3,), None, False, True),
    ("decode_cols_long_hd256", 1, 1, 9, 130, 2, 1, 256, 0, (), None, True, True),  # > 128 keys: two chunks
    # > 512 keys (a float32 tile): the cache split across blocks and merged; 16-byte and scalar loads
    ("decode_split_k", 1, 1, 6, 1100, 2, 1, 8, 0, (), None, False, False),
    ("decode_split_gqa4_fused", 2, 1, 5, 1030, 4, 1, 8, 1, (1,), None, True, False),
]


def _attention_cases():
    out = []
    for seed, (name, B, Tq, Tp, t0, nh, nkv, hd, layout, finished, full_pad, bias, cols) in enumerate(ATTENTION):
        r = _rng(100 + seed)
        L = 2 if hd < 64 else 1  # the cache write goes to layer L - 1; one layer keeps big cases small
        S, P = t0 + Tq + 3, max(64, t0 + 6)
        W = (nh + 2 * nkv) * hd
        qkv = r.standard_normal((B, Tq, W) if Tq > 1 else (B, W)).astype("float32")
        mask = np.ones((B, Tp), "int32")
        for b in range(B):
            mask[b, : r.integers(0, max(Tp // 2, 1))] = 0  # left padding
        if full_pad is not None:
            mask[full_pad] = 0
        pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
        if Tq == 1:
            pos = pos[:, -1] + 1 + (t0 - Tp)
            pos[0] = 10_000  # beyond the table: clipped to its last row
        fin = np.zeros(B, "int32")
        fin[list(finished)] = 1
        cos, sin = _rope(P, hd)
        qkv = _coarse(qkv)
        inp = {"qkv": qkv.T.copy() if cols else qkv,
               "k_cache": _coarse(r.standard_normal((L, B, nkv, hd, S))),
               "v_cache": _coarse(r.standard_normal((L, B, nkv, S, hd))),
               "cos": cos, "sin": sin, "pos": pos.astype("int64"), "key_mask": mask, "finished": fin}
        if bias:
            inp["bias"] = r.standard_normal(W).astype("float32")
        attrs = dict(layer=L - 1, t0=t0, num_heads=nh, num_kv_heads=nkv, head_dim=hd, layout=layout,
                     scale=1.0 / math.sqrt(hd), cols=cols)
        out.append(dict(name=f"attention_{name}", op="attention", attrs=attrs, inputs=inp))
    return out


SAMPLE = [
    # name, temperature, top_k, top_p, penalty, do_sample, suppress, cols
    ("greedy", 1.0, 0, 1.0, 1.0, False, [], False),
    ("greedy_penalty_suppress", 0.7, 0, 1.0, 1.3, False, [2], False),
    ("sample_plain", 1.0, 0, 1.0, 1.0, True, [], False),
    ("sample_suppress", 0.6, 0, 1.0, 1.0, True, [2, 5, 9999], False),
    ("top_k", 1.3, 5, 1.0, 1.0, True, [], False),
    ("top_p", 1.0, 0, 0.8, 1.0, True, [], False),
    ("top_k_top_p_penalty", 1.0, 3, 0.5, 1.5, True, [0], False),
    ("top_k_ge_vocab", 1.0, 1000, 0.95, 0.8, True, [], False),
    ("cols_top_k_top_p", 0.9, 7, 0.9, 1.2, True, [2], True),
    ("cols_greedy", 0.9, 0, 1.0, 1.2, False, [2], True),
]


def _sample_cases():
    out = []
    for seed, (name, temperature, top_k, top_p, penalty, do_sample, suppress, cols) in enumerate(SAMPLE):
        r = _rng(200 + seed)
        B, B0, V, N = 24, 30, 37 if seed % 2 else 301, 4
        logits = (r.standard_normal((B, V)) * 3.0).astype("float32")
        fin = np.zeros(B, "int32")
        fin[[1, 7, 20]] = 1
        inp = {"logits": logits.T.copy() if cols else logits,
               "presence": (r.random((B0, V)) < 0.3).astype("uint8"),
               "rows": r.permutation(B0)[:B].astype("int64"),
               "uniforms": np.minimum(r.random((N, B0), dtype=np.float32), 1 - 2 ** -20),
               "finished": fin}
        attrs = dict(step=2, temperature=temperature, top_k=top_k, top_p=top_p, penalty=penalty,
                     do_sample=do_sample, pad_id=3, suppress=suppress, cols=cols)
        out.append(dict(name=f"sample_{name}", op="sample", attrs=attrs, inputs=inp))
    return out


# several blocks per row (9,000 entries: 3 chunks of the CUDA sampler); logits on a 1/256 grid,
# so many are equal: ties broken by id across chunks (greedy) and inside the top-k / top-p sets
SAMPLE_MULTI_BLOCK = [
    # name, temperature, top_k, top_p, penalty, do_sample, suppress
    ("multiblock_greedy_ties", 1.0, 0, 1.0, 1.2, False, [4]),
    ("multiblock_top_k_top_p_ties", 0.9, 300, 0.85, 1.1, True, [4]),
]


def _sample_multi_block_cases():
    out = []
    for seed, (name, temperature, top_k, top_p, penalty, do_sample, suppress) in enumerate(SAMPLE_MULTI_BLOCK):
        r = _rng(250 + seed)
        B, B0, V, N = 6, 8, 9000, 2
        logits = _coarse(r.standard_normal((B, V)) * 3.0)
        logits[:, [10, 4500, 8999]] = logits.max() + 1  # the same largest logit in every chunk
        fin = np.zeros(B, "int32")
        fin[2] = 1
        inp = {"logits": logits, "presence": (r.random((B0, V)) < 0.1).astype("uint8"),
               "rows": r.permutation(B0)[:B].astype("int64"),
               "uniforms": np.minimum(r.random((N, B0), dtype=np.float32), 1 - 2 ** -20), "finished": fin}
        attrs = dict(step=1, temperature=temperature, top_k=top_k, top_p=top_p, penalty=penalty,
                     do_sample=do_sample, pad_id=3, suppress=suppress, cols=False)
        out.append(dict(name=f"sample_{name}", op="sample", attrs=attrs, inputs=inp))
    return out


def _update_cases():
    out = []
    for min_new, update_presence in ((0, True), (0, False), (100, True)):
        r = _rng(300 + min_new + update_presence)
        B, B0, N, V, step = 9, 12, 10, 30, 6
        rows = r.permutation(B0)[:B].astype("int64")
        out_tokens = np.full((B0, N), 3, "int64")
        out_tokens[:, :step] = r.integers(4, V, (B0, step))
        out_lp = np.zeros((B0, N), "float32")
        out_lp[:, :step] = -r.random((B0, step))
        tokens = r.integers(0, V, B).astype("int64")
        tokens[0] = 2  # a stop id
        tokens[1] = 9  # completes the stop sequence [7, 8, 9] for rows[1]
        out_tokens[rows[1], step - 2: step] = [7, 8]
        tokens[2] = 9  # 9 without [7, 8] before it: no stop
        out_tokens[rows[2], step - 2: step] = [5, 8]
        fin = np.zeros(B, "int32")
        fin[[3, 5]] = 1
        tokens[5] = 3
        inp = {"tokens": tokens, "logprobs": -r.random(B).astype("float32"), "rows": rows, "finished": fin,
               "pos": r.integers(5, 20, B).astype("int64"), "out_tokens": out_tokens, "out_logprobs": out_lp,
               "lengths": np.full(B0, step, "int64"),
               "presence": (r.random((B0, V)) < 0.2).astype("uint8") if update_presence else np.zeros((1, 1), "uint8")}
        attrs = dict(step=step, min_new_tokens=min_new, stop_ids=[2, 17], stop_seqs=[7, 8, 9, 11],
                     stop_seq_lens=[3, 1], update_presence=update_presence)
        out.append(dict(name=f"update_min{min_new}_presence{int(update_presence)}", op="update", attrs=attrs,
                        inputs=inp))
    return out


def make_cases():
    """Every case: dict(name, op, attrs, inputs={name: ndarray}) (no outputs)."""
    return (_rms_cases() + _swiglu_cases() + _pack_cases() + _attention_cases() + _sample_cases()
            + _sample_multi_block_cases() + _update_cases())


def cpu_outputs(case):
    """The C++ CPU kernels' outputs for `case` (needs Paddle and the built library): {name: ndarray},
    including the in-place tensors after the op (residual, caches, update state)."""
    import paddle

    from tests.rollout_ops_helpers import custom_and_fallback_ops

    ops, _ = custom_and_fallback_ops()
    t = {k: paddle.to_tensor(v) for k, v in case["inputs"].items()}
    a = case["attrs"]
    op = case["op"]
    if op == "rms_norm":
        if "residual" in t:
            out, res = ops.add_rms_norm(t["x"], t["residual"], t["w"], a["eps"], a["cols"])
            return {"out": out.numpy(), "residual": res.numpy()}
        return {"out": ops.rms_norm(t["x"], t["w"], a["eps"], a["cols"]).numpy()}
    if op == "swiglu":
        return {"out": ops.swiglu(t["x"], t.get("y"), a["cols"]).numpy()}
    if op == "pack_transposed":
        xs = [t[f"x{i}"] for i in range(a["n_inputs"])]
        dst = paddle.full([sum(x.shape[1] for x in xs), xs[0].shape[0]], float("nan"))
        return {"dst": ops.pack_transposed(dst, xs).numpy()}
    if op == "attention":
        out = ops.attention(t["qkv"], t["k_cache"], t["v_cache"], t["cos"], t["sin"], t["pos"], t["key_mask"],
                            t["finished"], a["layer"], a["t0"], a["num_heads"], a["num_kv_heads"], a["head_dim"],
                            a["layout"], a["scale"], t.get("bias"), a["cols"])
        return {"out": out.numpy(), "k_cache": t["k_cache"].numpy(), "v_cache": t["v_cache"].numpy()}
    if op == "sample":
        tok, lp = ops.sample(t["logits"], t["presence"], t["rows"], t["uniforms"], t["finished"], a["step"],
                             a["temperature"], a["top_k"], a["top_p"], a["penalty"], a["do_sample"], a["pad_id"],
                             a["suppress"], a["cols"])
        return {"tokens": tok.numpy(), "logprobs": lp.numpy()}
    if op == "update":
        n = ops.update(t["tokens"], t["logprobs"], t["rows"], t["finished"], t["pos"], t["out_tokens"],
                       t["out_logprobs"], t["lengths"], t["presence"], a["step"], a["min_new_tokens"], a["stop_ids"],
                       a["stop_seqs"], a["stop_seq_lens"], a["update_presence"])
        res = {k: t[k].numpy() for k in ("finished", "pos", "out_tokens", "out_logprobs", "lengths", "presence")}
        res["active"] = np.array([int(n.item())], "int64")
        return res
    raise ValueError(f"unknown op {op!r} in case {case['name']!r}")


def save(cases_with_outputs, path=FIXTURE):
    """One .npz: `<case>/in/<name>`, `<case>/out/<name>` arrays and `<case>/meta` (JSON: op, attrs)."""
    import json

    arrays = {}
    for c in cases_with_outputs:
        arrays[f"{c['name']}/meta"] = np.array(json.dumps({"op": c["op"], "attrs": c["attrs"]}))
        for k, v in c["inputs"].items():
            arrays[f"{c['name']}/in/{k}"] = v
        for k, v in c["outputs"].items():
            arrays[f"{c['name']}/out/{k}"] = v
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez_compressed(path, **arrays)


def load(path=FIXTURE):
    """The stored cases: list of dict(name, op, attrs, inputs, outputs), in file order."""
    import json

    cases = {}
    with np.load(path) as z:
        for key in z.files:
            name, kind = key.split("/", 2)[:2]
            c = cases.setdefault(name, {"name": name, "inputs": {}, "outputs": {}})
            if kind == "meta":
                meta = json.loads(str(z[key]))
                c["op"], c["attrs"] = meta["op"], meta["attrs"]
            else:
                c["inputs" if kind == "in" else "outputs"][key.split("/", 2)[2]] = z[key]
    return list(cases.values())


def main():
    cases = make_cases()
    for c in cases:
        c["outputs"] = cpu_outputs(c)
    save(cases)
    print(f"wrote {len(cases)} cases to {FIXTURE} ({os.path.getsize(FIXTURE) // 1024} KiB)")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
