"""The CUDA compile check (csrc/check_cuda.py) with the toolchain it caches outside the tree
(`python csrc/check_cuda.py` fills the cache; .ci/run runs it before the tests). No GPU needed:
every plain-CUDA kernel builds as a standalone shared library whose extern "C" launcher ctypes
can call (bad arguments come back as cudaErrorInvalidValue before any CUDA call), and a kernel
with a warning fails the check. Skips, with the command to run, when the cache is absent: the
default test suite never downloads toolchains."""
import os
import shutil

import numpy as np
import pytest

import cuda_ctypes
import cuda_kernel_cases

check = cuda_ctypes.check_cuda_module()
TOOLS = check.find_ready_tools()
pytestmark = pytest.mark.skipif(
    TOOLS is None,
    reason="no cached CUDA toolchain: run `python csrc/check_cuda.py` once (it downloads nvcc from PyPI)")


@pytest.fixture(scope="module")
def kernel_libs(tmp_path_factory):
    """Each kernel file built as a standalone library, reusing the libraries of identical earlier
    builds as check_cuda.py reuses its objects (same sources, headers, flags and compilers)."""
    out = str(tmp_path_factory.mktemp("cuda_libs"))
    nvcc = check.nvcc_path(TOOLS)
    cache = check.ObjectCache(check.cache_dir("cuda-objects", "PPO_CUDA_OBJECT_CACHE"), check.cached_inputs(),
                              {out: "<out>"}, [check.host_cxx()])
    return {k: check.build_kernel_library(os.path.join(cuda_ctypes.CUDA_DIR, f"{k}.cu"), out, "80", nvcc=nvcc,
                                          cache=cache)
            for k in cuda_ctypes.LAUNCHERS}


def test_every_kernel_file_has_a_launcher_entry():
    files = sorted(os.path.splitext(os.path.basename(p))[0] for p in check.kernel_sources())
    assert files == sorted(cuda_ctypes.LAUNCHERS)


def test_kernels_build_standalone_and_reject_bad_arguments(kernel_libs):
    INVALID = cuda_ctypes.CUDA_ERROR_INVALID_VALUE
    f = {k: cuda_ctypes.load(path, k) for k, path in kernel_libs.items()}
    n = None
    assert f["rms_norm"](7, n, n, n, n, 4, 8, 1e-6, 0, n) == INVALID  # unknown dtype code
    assert f["rms_norm"](0, n, n, n, n, 4, 0, 1e-6, 0, n) == INVALID  # H = 0
    assert f["rms_norm"](0, n, n, n, n, 0, 8, 1e-6, 0, n) == 0  # nothing to do: no launch
    assert f["swiglu"](0, n, n, n, 4, 2, 3, n) == INVALID  # unknown mode
    assert f["swiglu"](0, n, n, n, 4, 2, 0, n) == INVALID  # mode 0 needs y
    assert f["pack_transposed"](5, n, n, 3, 3, n) == INVALID
    assert f["pack_transposed"](0, n, n, 0, 3, n) == 0
    att = lambda dtype, hd, nh, nkv, t0, S: f["attention"](dtype, *[n] * 10, 2, 1, nh, nkv, hd, S, 3, 8, 0, t0, 0,
                                                           0.1, 0, n)
    assert att(0, 258, 2, 1, 0, 4) == INVALID  # head_dim above 256
    assert att(0, 7, 2, 1, 0, 4) == INVALID  # odd head_dim
    assert att(0, 8, 3, 2, 0, 4) == INVALID  # heads not a multiple of kv heads
    assert att(0, 8, 2, 1, 4, 4) == INVALID  # slot t0 beyond the cache
    assert att(9, 8, 2, 1, 0, 4) == INVALID  # unknown dtype
    smp = lambda temperature, n_sup: f["sampling"](0, *[n] * 7, 2, 10, 2, 0, temperature, 0, 1.0, 1.0, 1, 0,
                                                    cuda_ctypes.host_int64(range(n_sup)), n_sup, 0, n)
    assert smp(0.0, 0) == INVALID  # temperature must be > 0
    assert smp(1.0, 65) == INVALID  # more than 64 suppressed ids
    upd = lambda step, n_ids: f["step_update"](*[n] * 9, cuda_ctypes.host_int64([0]), 2, 4, 0, step, 0,
                                               cuda_ctypes.host_int64(range(n_ids)), n_ids, n, 0, n, 0, n)
    assert upd(4, 0) == INVALID  # step beyond N
    assert upd(0, 65) == INVALID  # more than 64 stop ids


def test_sampler_split_plan_and_workspace(kernel_libs):
    """Host-only queries of the multi-block sampler (no CUDA call): blocks per row grow with the
    vocabulary (about 4,096 entries each, at most 64 of at most 16,384), the workspace with the rows."""
    lib = cuda_ctypes.load_all(kernel_libs["sampling"])
    per_row = lib.ppo_cuda_sample_blocks_per_row
    assert [per_row(v) for v in (37, 4096, 4097, 128256, 151936, 2**20)] == [1, 1, 2, 32, 38, 64]
    assert per_row(0) == -1 and per_row(2**20 + 1) == -1  # PPO_CUDA_MAX_VOCAB
    ws = lib.ppo_cuda_sample_workspace_bytes
    assert ws(0, 128256) == 0 and ws(-1, 5) == -1 and ws(4, 0) == -1
    assert ws(64, 128256) > ws(1, 128256) > 2 * 2048 * 8  # two radix histograms per row at least
    n = None
    # valid arguments but no workspace: refused before any CUDA call
    args = [2, *[n] * 7, 2, 128256, 2, 0, 1.0, 50, 0.9, 1.0, 1, 0, n, 0, 0]
    assert lib.ppo_cuda_sample_ws(*args, n, 0, n) == cuda_ctypes.CUDA_ERROR_INVALID_VALUE
    assert lib.ppo_cuda_sample_ws(*args, n, ws(2, 128256), n) == cuda_ctypes.CUDA_ERROR_INVALID_VALUE
    args[9] = 2**20 + 1  # a vocabulary above PPO_CUDA_MAX_VOCAB
    assert lib.ppo_cuda_sample(*args, n) == cuda_ctypes.CUDA_ERROR_INVALID_VALUE


def test_sampler_chunk_target_macro_moves_the_split_plan(kernel_libs, tmp_path):
    """`PPO_SAMPLE_CHUNK_TARGET` (a bench variant): 16,384 entries per block, the same 64-block cap."""
    cache = check.ObjectCache(check.cache_dir("cuda-objects", "PPO_CUDA_OBJECT_CACHE"), check.cached_inputs(),
                              {str(tmp_path): "<out>"}, [check.host_cxx()])
    path = check.build_kernel_library(os.path.join(cuda_ctypes.CUDA_DIR, "sampling.cu"), str(tmp_path), "80",
                                      nvcc=check.nvcc_path(TOOLS), cache=cache,
                                      extra=["-DPPO_SAMPLE_CHUNK_TARGET=16384"], tag="_chunk16k")
    per_row = cuda_ctypes.load_all(path).ppo_cuda_sample_blocks_per_row
    assert [per_row(v) for v in (37, 16384, 16385, 128256, 151936, 2**20)] == [1, 1, 2, 8, 10, 64]
    default = cuda_ctypes.load_all(kernel_libs["sampling"])
    assert cuda_ctypes.load_all(path).ppo_cuda_sample_workspace_bytes(64, 151936) < \
        default.ppo_cuda_sample_workspace_bytes(64, 151936)  # fewer chunk statistics per row


def test_attention_split_plan(kernel_libs):
    """Split-K plan: chunks are whole tiles, cover every key, none is empty, at most 64 of them,
    and there are about two blocks per SM when the rows and heads alone leave the GPU idle."""
    import ctypes

    lib = cuda_ctypes.load_all(kernel_libs["attention"])

    def plan(keys, blocks, tile=1024, sms=132):
        chunk = ctypes.c_int64(0)
        n = lib.ppo_cuda_attention_split_plan(keys, blocks, tile, sms, ctypes.byref(chunk))
        assert chunk.value % tile == 0 and n * chunk.value >= keys and (n - 1) * chunk.value < keys and 1 <= n <= 64
        return n, chunk.value

    assert plan(2048, 32 * 8) == (2, 1024)  # B32 x 8 KV groups: 256 blocks, two chunks
    assert plan(8192, 8 * 8) == (4, 2048)  # B8 x 8 KV groups, 8k cache: 4 chunks -> 256 blocks
    assert plan(1024, 8 * 1024 * 8) == (1, 1024)  # prefill: enough blocks without splitting
    assert plan(5, 1, tile=128) == (1, 128)  # fewer keys than a tile
    assert plan(10**6, 1) == (62, 16384)  # capped at 64 chunks
    assert lib.ppo_cuda_attention_split_plan(0, 1, 128, 132, None) == -1
    bytes_ = ctypes.c_int64(-1)
    INVALID = cuda_ctypes.CUDA_ERROR_INVALID_VALUE
    assert lib.ppo_cuda_attention_workspace_bytes(9, 2, 1, 4, 2, 8, 0, ctypes.byref(bytes_)) == INVALID
    assert lib.ppo_cuda_attention_workspace_bytes(0, 2, 1, 4, 3, 8, 0, ctypes.byref(bytes_)) == INVALID
    assert lib.ppo_cuda_attention_workspace_bytes(0, 2, 1, 4, 2, 8, 0, None) == INVALID
    assert lib.ppo_cuda_attention_workspace_bytes(0, 0, 1, 4, 2, 8, 0, ctypes.byref(bytes_)) == 0
    assert bytes_.value == 0
    n = None
    att_ws = lambda hd: lib.ppo_cuda_attention_ws(0, *[n] * 10, 2, 1, 2, 1, hd, 4, 3, 8, 0, 0, 0, 0.1, 0, n, 0, n)
    assert att_ws(258) == INVALID  # head_dim above 256, refused before any CUDA call


def test_a_warning_fails_the_check(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(float* x) { int unused = 3; if (threadIdx.x < 2) x[0] = 1.f; }\n")
    good = tmp_path / "good.cu"
    good.write_text('__global__ void k(float* x) { if (threadIdx.x < 2) x[0] = 1.f; }\n')
    results = {os.path.basename(label.split()[0]): (ok, out)
               for label, ok, out in check.compile_kernels(TOOLS, str(tmp_path), [str(bad), str(good)], archs=("90",))}
    assert results["good.cu"][0], results["good.cu"][1]
    assert not results["bad.cu"][0]
    assert "unused" in results["bad.cu"][1]


class HostArrays:
    """Host numpy arrays in place of device memory: for checking the GPU tests' plumbing on a
    machine without a GPU, where every launch fails before any memory is touched."""

    name = "host"

    def put(self, a):
        return np.array(a, copy=True, order="C")

    def ptr(self, a):
        return a.ctypes.data

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def get(self, a):
        return a

    def stream(self):
        return None


@pytest.mark.skipif(os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None,
                    reason="a GPU is present: tests/test_cuda_kernels.py runs the real thing")
def test_gpu_harness_passes_every_argument_check(kernel_libs):
    """tests/test_cuda_kernels.py's calls, on every stored case, get past the launchers' argument
    checks (ppo_cuda.h limits, ctypes types and counts): with no GPU each launch then reports a
    CUDA error other than cudaErrorInvalidValue."""
    fns = {k: cuda_ctypes.load(path, k) for k, path in kernel_libs.items()}
    seen = {}
    for case in cuda_kernel_cases.load():
        statuses = []
        cuda_ctypes.run_case(HostArrays(), fns, case, check=lambda status, op: statuses.append(status))
        assert statuses, case["name"]
        assert cuda_ctypes.CUDA_ERROR_INVALID_VALUE not in statuses, (case["name"], statuses)
        assert 0 not in statuses, (case["name"], statuses)  # no GPU here: nothing can launch
        seen[case["op"]] = statuses[0]
    assert sorted(seen) == ["attention", "pack_transposed", "rms_norm", "sample", "swiglu", "update"]
