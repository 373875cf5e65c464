"""ctypes view of the plain-CUDA launchers (csrc/cuda/ppo_cuda.h), for the kernel tests.

Each csrc/cuda/<kernel>.cu is built on its own as a shared library (csrc/check_cuda.py's
`build_kernel_library`); `load(path, symbol)` returns the launcher with its argument types set,
so a wrong argument count or type is a ctypes error rather than garbage on the device.
"""
import concurrent.futures
import ctypes
import importlib.util
import os

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_DIR = os.path.join(REPO, "csrc", "cuda")

P = ctypes.c_void_p
I64 = ctypes.c_int64
INT = ctypes.c_int
F32 = ctypes.c_float

CUDA_ERROR_INVALID_VALUE = 1  # cudaErrorInvalidValue
DTYPE = {"float32": 0, "float16": 1, "bfloat16": 2}  # PPO_CUDA_FLOAT32 / FLOAT16 / BFLOAT16

# kernel file -> (symbol, argument types); order and types as declared in ppo_cuda.h
LAUNCHERS = {
    "rms_norm": ("ppo_cuda_rms_norm", [INT, P, P, P, P, I64, I64, F32, INT, P]),
    "swiglu": ("ppo_cuda_swiglu", [INT, P, P, P, I64, I64, INT, P]),
    "pack_transposed": ("ppo_cuda_transpose", [INT, P, P, I64, I64, P]),
    "attention": ("ppo_cuda_attention", [INT, P, P, P, P, P, P, P, P, P, P, I64, I64, I64, I64, I64, I64, I64, I64,
                                         I64, I64, I64, F32, INT, P]),
    "sampling": ("ppo_cuda_sample", [INT, P, P, P, P, P, P, P, I64, I64, I64, I64, F32, I64, F32, F32, INT, I64, P,
                                     I64, INT, P]),
    "step_update": ("ppo_cuda_update", [P, P, P, P, P, P, P, P, P, P, I64, I64, I64, I64, I64, P, I64, P, I64, P,
                                        I64, P]),
}


# the other extern "C" functions of the kernel files: workspace-taking launchers and host-only
# plan queries (ppo_cuda.h); restype int unless named in INT64_RESULT
EXTRA = {
    "ppo_cuda_attention_ws": LAUNCHERS["attention"][1][:-1] + [P, I64, P],
    "ppo_cuda_attention_workspace_bytes": [INT, I64, I64, I64, I64, I64, I64, P],
    "ppo_cuda_attention_split_plan": [I64, I64, I64, I64, P],
    "ppo_cuda_sample_ws": LAUNCHERS["sampling"][1][:-1] + [P, I64, P],
    "ppo_cuda_sample_workspace_bytes": [I64, I64],
    "ppo_cuda_sample_blocks_per_row": [I64],
}
INT64_RESULT = {"ppo_cuda_attention_split_plan", "ppo_cuda_sample_workspace_bytes", "ppo_cuda_sample_blocks_per_row"}


def check_cuda_module():
    """csrc/check_cuda.py as a module (csrc/ is not a package)."""
    path = os.path.join(REPO, "csrc", "check_cuda.py")
    spec = importlib.util.spec_from_file_location("_ppo_check_cuda", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_built = {}


def kernel_libraries(kernels, out_dir, arch, nvcc):
    """{kernel: path} of csrc/cuda/<kernel>.cu built as shared libraries for sm_<arch>, compiled in
    parallel once per process (the test modules share them). With `$PPO_CUDA_LIBDIR` set (a GPU
    check script builds there first), a library already there is used as it is."""
    prebuilt = os.environ.get("PPO_CUDA_LIBDIR")
    check = check_cuda_module()

    def one(kernel):
        if (kernel, arch) not in _built:
            path = os.path.join(prebuilt, f"lib{kernel}_sm{arch}.so") if prebuilt else None
            if not (path and os.path.exists(path)):
                # warnings are the compile check's business (csrc/check_cuda.py); another nvcc may add its own
                path = check.build_kernel_library(os.path.join(CUDA_DIR, f"{kernel}.cu"), prebuilt or out_dir, arch,
                                                  nvcc=nvcc, werror=False)
            _built[(kernel, arch)] = path
        return kernel, _built[(kernel, arch)]

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(kernels)) as pool:
        return dict(pool.map(one, kernels))


def load(lib_path, kernel):
    """The launcher of `kernel` (a key of LAUNCHERS) from its standalone library."""
    symbol, argtypes = LAUNCHERS[kernel]
    fn = getattr(ctypes.CDLL(lib_path), symbol)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def load_all(lib_path):
    """The library with every launcher and query it defines typed (LAUNCHERS and EXTRA)."""
    lib = ctypes.CDLL(lib_path)
    for symbol, argtypes in [v for v in LAUNCHERS.values()] + list(EXTRA.items()):
        if hasattr(lib, symbol):
            fn = getattr(lib, symbol)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int64 if symbol in INT64_RESULT else ctypes.c_int
    return lib


def host_int64(values):
    """A host int64 array for the launchers' host-side list arguments (None when empty)."""
    values = [int(v) for v in values]
    return (ctypes.c_int64 * len(values))(*values) if values else None


def expect_success(status, what):
    assert status == 0, f"{what}: CUDA error code {status}"


def run_case(dev, fns, case, dtype="float32", check=expect_success):
    """Runs `case` through the launchers `fns` on device `dev` (put / ptr / empty / get / stream);
    returns {output name: host array} like cuda_kernel_cases.cpu_outputs. Each launcher's status
    goes to `check(status, op)`."""
    a, op, s = case["attrs"], case["op"], dev.stream()
    d = {k: dev.put(v) for k, v in case["inputs"].items()}
    host = case["inputs"]
    P = dev.ptr
    code = DTYPE[dtype]
    if op == "rms_norm":
        x = host["x"]
        H = x.shape[0] if a["cols"] else x.shape[-1]
        out = dev.empty(x.shape, x.dtype)
        res = P(d["residual"]) if "residual" in d else None
        status = fns["rms_norm"](code, P(d["x"]), res, P(d["w"]), P(out), x.size // H, H, a["eps"], int(a["cols"]), s)
        check(status, op)
        got = {"out": dev.get(out)}
        if "residual" in d:
            got["residual"] = dev.get(d["residual"])
        return got
    if op == "swiglu":
        x = host["x"]
        if "y" in d:
            mode, shape = 0, x.shape
        elif a["cols"]:
            mode, shape = 2, (x.shape[0] // 2, x.shape[1])
        else:
            mode, shape = 1, x.shape[:-1] + (x.shape[-1] // 2,)
        out = dev.empty(shape, x.dtype)
        check(fns["swiglu"](code, P(d["x"]), P(d["y"]) if "y" in d else None, P(out), int(np.prod(shape)), shape[-1],
                            mode, s), op)
        return {"out": dev.get(out)}
    if op == "pack_transposed":
        xs = [host[f"x{i}"] for i in range(a["n_inputs"])]
        K = xs[0].shape[0]
        dst = dev.put(np.full((sum(x.shape[1] for x in xs), K), np.nan, "float32"))
        row0 = 0
        for i, x in enumerate(xs):
            check(fns["pack_transposed"](code, P(d[f"x{i}"]), P(dst) + row0 * K * 4, K, x.shape[1], s), op)
            row0 += x.shape[1]
        return {"dst": dev.get(dst)}
    if op == "attention":
        q, cols = host["qkv"], a["cols"]
        B = q.shape[1] if cols else q.shape[0]
        Tq = q.shape[1] if q.ndim == 3 else 1
        D = a["num_heads"] * a["head_dim"]
        shape = (D, B) if cols else ((B, Tq, D) if q.ndim == 3 else (B, D))
        out = dev.empty(shape, "float32")
        check(fns["attention"](code, P(d["qkv"]), P(d["bias"]) if "bias" in d else None, P(d["k_cache"]),
                               P(d["v_cache"]), P(d["cos"]), P(d["sin"]), P(d["pos"]), P(d["key_mask"]),
                               P(d["finished"]), P(out), B, Tq, a["num_heads"], a["num_kv_heads"], a["head_dim"],
                               host["k_cache"].shape[4], host["key_mask"].shape[1], host["cos"].shape[0], a["layer"],
                               a["t0"], a["layout"], a["scale"], int(cols), s), op)
        return {"out": dev.get(out), "k_cache": dev.get(d["k_cache"]), "v_cache": dev.get(d["v_cache"])}
    if op == "sample":
        lg, cols = host["logits"], a["cols"]
        B, V = (lg.shape[1], lg.shape[0]) if cols else lg.shape
        tokens, logprobs = dev.empty((B,), "int64"), dev.empty((B,), "float32")
        sup = a["suppress"]
        check(fns["sampling"](code, P(d["logits"]), P(d["presence"]), P(d["rows"]), P(d["uniforms"]),
                              P(d["finished"]), P(tokens), P(logprobs), B, V, host["uniforms"].shape[1], a["step"],
                              a["temperature"], a["top_k"], a["top_p"], a["penalty"], int(a["do_sample"]), a["pad_id"],
                              host_int64(sup), len(sup), int(cols), s), op)
        return {"tokens": dev.get(tokens), "logprobs": dev.get(logprobs)}
    if op == "update":
        active = dev.empty((1,), "int64")
        up = a["update_presence"]
        V = host["presence"].shape[1] if up else 0
        check(fns["step_update"](P(d["tokens"]), P(d["logprobs"]), P(d["rows"]), P(d["finished"]), P(d["pos"]),
                                 P(d["out_tokens"]), P(d["out_logprobs"]), P(d["lengths"]),
                                 P(d["presence"]) if up else None, P(active), host["tokens"].size,
                                 host["out_tokens"].shape[1], V, a["step"], a["min_new_tokens"],
                                 host_int64(a["stop_ids"]), len(a["stop_ids"]),
                                 host_int64(a["stop_seqs"]), len(a["stop_seqs"]),
                                 host_int64(a["stop_seq_lens"]), len(a["stop_seq_lens"]), s), op)
        got = {k: dev.get(d[k]) for k in ("finished", "pos", "out_tokens", "out_logprobs", "lengths", "presence")}
        got["active"] = dev.get(active)
        return got
    raise ValueError(f"unknown op {op!r}")
