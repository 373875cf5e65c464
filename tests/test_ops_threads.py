"""The CPU kernels of csrc/ give bit-identical results at any OpenMP thread count.

One child process per thread count (OMP_NUM_THREADS=1 and 2) runs every parallelised kernel,
forward and backward, on shapes above the parallel threshold (`kParallelMinWork` in
csrc/common.h) and one below, and dumps its outputs to an .npz; the parent asserts the two
dumps are bitwise equal and that the kernels match their pure-Paddle / numpy twins (with the
tolerances of tests/test_ops_*.py and tests/test_train_ops.py).

    python tests/test_ops_threads.py OUT.npz     # the child (run by the test)
"""
import math
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the child runs this file as a script
    sys.path.insert(0, ROOT)


# ---------------------------------------------------------------- the child
def _rng(seed):
    return np.random.default_rng(seed)


def _t(a):
    import paddle

    return paddle.to_tensor(np.ascontiguousarray(a).astype(a.dtype))


def _rollout_norm_swiglu(out, custom, fb):
    rng = _rng(1)
    for name, shape, cols in (("rows", (3, 50, 256), False), ("small", (2, 256), False),
                              ("cols", (520, 37), True), ("odd", (2, 71, 130), False)):
        H = shape[0] if cols else shape[-1]
        x, r, w = _t(rng.standard_normal(shape, "float32")), rng.standard_normal(shape, "float32"), _t(rng.random(H, "float32"))
        out[f"k:rms_{name}"] = custom.rms_norm(x, w, 1e-6, cols).numpy()
        out[f"ref:rms_{name}"] = fb.rms_norm(x, w, 1e-6, cols).numpy()
        res_k, res_f = _t(r), _t(r)
        out[f"k:add_rms_{name}"] = custom.add_rms_norm(x, res_k, w, 1e-6, cols)[0].numpy()
        out[f"k:add_res_{name}"] = res_k.numpy()
        out[f"ref:add_rms_{name}"] = fb.add_rms_norm(x, res_f, w, 1e-6, cols)[0].numpy()
        out[f"ref:add_res_{name}"] = res_f.numpy()
    for name, shape, two, cols in (("fused", (40, 1380), False, False), ("split", (5, 2003), True, False),
                                   ("cols", (1380, 21), False, True), ("small", (2, 1376), False, False)):
        x = _t(rng.standard_normal(shape, "float32") * 4)
        y = _t(rng.standard_normal(shape, "float32")) if two else None
        out[f"k:swiglu_{name}"] = custom.swiglu(x, y, cols).numpy()
        out[f"ref:swiglu_{name}"] = fb.swiglu(x, y, cols).numpy()


ATTENTION = {  # name: (B, Tq, Tp, t0, nh, nkv, hd, layout, finished, bias, cols)
    "prefill": (3, 24, 24, 0, 4, 2, 64, 1, (1,), True, False),
    "decode": (5, 1, 20, 40, 4, 4, 64, 0, (2,), False, False),
    "decode_cols": (7, 1, 20, 40, 6, 2, 32, 0, (3,), True, True),
    "small": (2, 1, 4, 5, 2, 1, 8, 0, (), False, False),
}


def _rollout_attention(out, custom, fb):
    from tests.test_ops_attention import _case, _rope_tables

    for name, (B, Tq, Tp, t0, nh, nkv, hd, layout, fin_rows, bias, cols) in ATTENTION.items():
        cos, sin = _rope_tables(128, hd)
        qkv, kc, vc, pos, mask, fin = _case(B + Tq, B, Tq, Tp, t0, nh, nkv, hd, finished_rows=fin_rows)
        b = _t(_rng(B).standard_normal(qkv.shape[-1], "float32")) if bias else None
        if cols:
            qkv = qkv.transpose([1, 0]).contiguous()
        args = (cos, sin, pos, mask, fin, 1, t0, nh, nkv, hd, layout, 1.0 / math.sqrt(hd), b, cols)
        for key, ops in (("k", custom), ("ref", fb)):
            k2, v2 = _t(kc.numpy()), _t(vc.numpy())
            out[f"{key}:attn_{name}"] = ops.attention(qkv, k2, v2, *args).numpy()
            out[f"{key}:attn_{name}_kcache"], out[f"{key}:attn_{name}_vcache"] = k2.numpy(), v2.numpy()


def _grads(out, name, fn, ref_fn, inputs, seed):
    """Forward and backward (paddle.grad with a random upstream gradient) of kernel and twin."""
    import paddle

    for key, f in (("k", fn), ("ref", ref_fn)):
        xs = [_t(a) for a in inputs]
        for x in xs:
            x.stop_gradient = False
        y = f(*xs)
        ys = list(y) if isinstance(y, (tuple, list)) else [y]
        gs = [_t(_rng(seed + i).standard_normal(t.shape, "float32")) for i, t in enumerate(ys)]
        grads = paddle.grad(ys, xs, grad_outputs=gs)
        for i, t in enumerate(ys):
            out[f"{key}:{name}_out{i}"] = t.numpy()
        for i, g in enumerate(grads):
            out[f"{key}:{name}_grad{i}"] = g.numpy()


def _train_ops(out):
    from ppo.models import fused_train_ops as F
    from tests.test_train_ops import sdpa_inputs

    rng = _rng(2)
    for name, shape in (("rms", (2, 40, 200)), ("rms_small", (3, 48))):
        x, w = rng.standard_normal(shape, "float32"), rng.random(shape[-1], "float32") + 0.5
        _grads(out, name, lambda a, b: F.fused_rms_norm(a, b, 1e-6), lambda a, b: F.rms_norm_reference(a, b, 1e-6), (x, w), 3)
    for name, bc, S in (("rope", 2, 30), ("rope_shared", 1, 30), ("rope_small", 1, 3)):
        q, k = rng.standard_normal((2, S, 4, 64), "float32"), rng.standard_normal((2, S, 2, 64), "float32")
        cs, sn = _t(rng.standard_normal((bc, S, 64), "float32")), _t(rng.standard_normal((bc, S, 64), "float32"))
        _grads(out, name, lambda a, b: F.fused_rope(a, b, cs, sn), lambda a, b: F.rope_reference(a, b, cs, sn), (q, k), 4)
    for name, shapes in (("swiglu", [(2, 30, 701)] * 2), ("swiglu_fused", [(60, 1400)]), ("swiglu_small", [(3, 17)] * 2)):
        xs = [rng.standard_normal(s, "float32") * 4 for s in shapes]
        _grads(out, name, F.fused_swiglu, F.swiglu_reference, xs, 5)
    for name, S, H, D in (("sdpa", 33, 4, 32), ("sdpa_small", 5, 2, 8)):
        q, k, v, mask = sdpa_inputs(S, B=3, H=H, D=D)
        _grads(out, name, lambda a, b, c: F.fused_sdpa(a, b, c, mask, 0.3), lambda a, b, c: F.sdpa_reference(a, b, c, mask, 0.3),
               (q.numpy(), k.numpy(), v.numpy()), 6)


def _logits_and_adamw(out):
    import paddle

    from ppo.models import fused_train_ops as F

    rng = _rng(3)
    for name, (c, V) in (("logit", (37, 1000)), ("logit_small", (2, 50))):
        z, y = rng.standard_normal((c, V), "float32") * 3, rng.integers(0, V, c).astype("int64")
        logp, ent, lse = F.LOGIT_KERNELS.stats(_t(z), _t(y), True)
        out[f"k:{name}_logp"], out[f"k:{name}_ent"], out[f"k:{name}_lse"] = logp.numpy(), ent.numpy(), lse.numpy()
        gl, ge = rng.standard_normal(c, "float32"), rng.standard_normal(c, "float32")
        out[f"k:{name}_dz"] = F.LOGIT_KERNELS.grad_z(_t(z), _t(y), _t(gl), _t(ge)).numpy()
        z64 = z.astype("float64")
        lse64 = np.log(np.exp(z64 - z64.max(1, keepdims=True)).sum(1)) + z64.max(1)
        p = np.exp(z64 - lse64[:, None])
        mean_z = (p * z64).sum(1)
        out[f"ref:{name}_logp"], out[f"ref:{name}_lse"] = z64[np.arange(c), y] - lse64, lse64
        out[f"ref:{name}_ent"] = lse64 - mean_z
        dz = -p * (gl[:, None] + ge[:, None] * (z64 - mean_z[:, None]))
        dz[np.arange(c), y] += gl
        out[f"ref:{name}_dz"] = dz
    sizes = (70001, 300, 5, 40000, 1)
    ps, gs, m1, m2 = ([rng.standard_normal(n, "float32") for n in sizes] for _ in range(4))
    m2 = [np.abs(a) for a in m2]
    t = [[_t(a) for a in arrs] for arrs in (ps, gs, m1, m2)]
    b1p, b2p = [_t(np.array([0.9 ** 3], "float32")) for _ in sizes], [_t(np.array([0.999 ** 3], "float32")) for _ in sizes]
    lr, beta1, beta2, eps, coeff, clip = 1e-3, 0.9, 0.999, 1e-8, 0.01, 5.0
    decay = [1, 0, 1, 1, 0]
    norm = paddle._C_ops._run_custom_op("train_adamw", *t, b1p, b2p, lr, beta1, beta2, eps, coeff, clip, decay)[0]
    out["k:adamw_norm"] = norm.numpy()
    for i in range(len(sizes)):
        out[f"k:adamw_p{i}"], out[f"k:adamw_m1{i}"], out[f"k:adamw_m2{i}"] = t[0][i].numpy(), t[2][i].numpy(), t[3][i].numpy()
    gnorm = math.sqrt(sum(float((g.astype("float64") ** 2).sum()) for g in gs))
    out["ref:adamw_norm"] = np.array([gnorm])
    scale = clip / max(gnorm, clip)
    for i, (p, g, a, b) in enumerate(zip(ps, gs, m1, m2)):
        g = g.astype("float64") * scale
        a, b = beta1 * a + (1 - beta1) * g, beta2 * b + (1 - beta2) * g * g
        step, eps_hat = lr * math.sqrt(1 - 0.999 ** 3) / (1 - 0.9 ** 3), eps * math.sqrt(1 - 0.999 ** 3)
        keep = 1 - lr * coeff if decay[i] else 1.0
        out[f"ref:adamw_p{i}"], out[f"ref:adamw_m1{i}"], out[f"ref:adamw_m2{i}"] = p * keep - step * a / (np.sqrt(b) + eps_hat), a, b


def child(path):
    """Run every kernel (this process's OMP_NUM_THREADS) and save the outputs to `path`."""
    from ppo import kernels
    from ppo.rollout import ops

    kernels.ensure_built()
    out = {}
    custom, fb = ops.get_ops("custom"), ops.FallbackOps()
    x = _t(_rng(0).standard_normal((64, 2048), "float32"))
    before = len(os.listdir("/proc/self/task"))
    custom.swiglu(x)  # the first OpenMP region of the process starts its worker threads
    out["meta:new_threads"] = np.array(len(os.listdir("/proc/self/task")) - before)
    _rollout_norm_swiglu(out, custom, fb)
    _rollout_attention(out, custom, fb)
    _train_ops(out)
    _logits_and_adamw(out)
    np.savez(path, **out)


# ---------------------------------------------------------------- the test
def _start_child(tmp_path, threads):
    path = str(tmp_path / f"threads{threads}.npz")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=ROOT)
    env.pop("PPO_OPS_PARALLEL_MIN_WORK", None)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), path], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, path


def _finish_child(proc, path):
    _, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return dict(np.load(path))


def _tolerance(key):
    """(atol, rtol) of the op tests for the kernel-vs-twin comparison of `key`."""
    if "adamw" in key or "logit" in key:
        return 1e-5, 1e-4
    if "sdpa" in key or "attn" in key:
        return 2e-5, 1e-4
    return 1e-5, 1e-5


def test_kernels_bitwise_equal_at_one_and_two_threads(tmp_path):
    from ppo import kernels

    kernels.ensure_built()  # once here, not in two children at a time
    children = [_start_child(tmp_path, 1), _start_child(tmp_path, 2)]  # side by side: results never depend on timing
    one, two = (_finish_child(*c) for c in children)
    assert sorted(one) == sorted(two)
    # one thread: no OpenMP region ever starts; two: the first split call starts a worker thread
    assert int(one["meta:new_threads"]) == 0 and int(two["meta:new_threads"]) >= 1
    kernel_keys = [k for k in one if k.startswith("k:")]
    assert len(kernel_keys) > 80
    for key in kernel_keys:
        a, b = one[key], two[key]
        assert a.dtype == np.float32 and a.shape == b.shape, key
        assert np.array_equal(a, b), f"{key}: 1 vs 2 threads differ by {np.abs(a - b).max()}"
        ref = one["ref:" + key[2:]]
        atol, rtol = _tolerance(key)
        np.testing.assert_allclose(a, ref, atol=atol, rtol=rtol, err_msg=key)


def test_the_library_links_the_openmp_runtime_of_paddles_mkl():
    """Linked with GCC's libgomp beside MKL's libiomp5, the two runtimes' spinning workers made the
    GRPO step several times slower at two threads: where Paddle ships libiomp5 the library must
    name it, and not libgomp, among its own dependencies (`readelf -d`, not `ldd`, which also lists
    libpaddle.so's)."""
    sys.path.insert(0, os.path.join(ROOT, "csrc"))
    import build_ops
    from ppo import kernels
    from ppo.kernels.library import lib_path

    kernels.ensure_built()
    needed = [ln.split("[")[1].rstrip("]") for ln in
              subprocess.run(["readelf", "-d", lib_path()], capture_output=True, text=True, check=True).stdout.splitlines()
              if "(NEEDED)" in ln]
    libs = os.listdir(build_ops._paddle_libs())
    assert build_ops.openmp_runtime() == ("libiomp5" if "libiomp5.so" in libs else "libgomp")
    expected, other = ("libiomp5.so", "libgomp.so.1") if build_ops.openmp_runtime() == "libiomp5" else ("libgomp.so.1", "libiomp5.so")
    assert expected in needed and other not in needed, needed


if __name__ == "__main__":
    child(sys.argv[1])
