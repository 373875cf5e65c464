"""The plain-CUDA kernels (csrc/cuda/*.cu) on a real GPU, against the C++ CPU kernels.

Each kernel is compiled on its own with nvcc (`nvcc -shared`, for the GPU's architecture) and
its extern "C" launcher is called through ctypes with device pointers from PyTorch or CuPy
(whichever is installed), on the stored random inputs of tests/cuda_kernel_cases.py (odd sizes,
padding, finished rows, compacted batches, both layouts). Outputs, and the tensors the ops write
in place, are compared with what the CPU kernels computed on the same inputs. Paddle is not
needed. Float16 / bfloat16 are checked for RMSNorm and SwiGLU through PyTorch.

Skips, with the reason, on a machine without a CUDA GPU, without PyTorch/CuPy, or without nvcc
(on PATH, in $CUDA_HOME/bin, or the PyPI one cached by `python csrc/check_cuda.py`).
"""
import os
import shutil

import numpy as np
import pytest

import cuda_ctypes
import cuda_kernel_cases

CASES = cuda_kernel_cases.load()


class TorchDevice:
    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch
        self.arch = "%d%d" % torch.cuda.get_device_capability()

    def put(self, a):
        return self.torch.from_numpy(np.ascontiguousarray(a)).cuda()

    def ptr(self, t):
        return t.data_ptr()

    def empty(self, shape, dtype):
        return self.put(np.empty(shape, dtype))

    def get(self, t):
        self.torch.cuda.synchronize()
        return t.cpu().numpy()

    def stream(self):
        return self.torch.cuda.current_stream().cuda_stream


class CupyDevice:
    name = "cupy"

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.arch = str(cupy.cuda.Device().compute_capability)

    def put(self, a):
        return self.cupy.asarray(np.ascontiguousarray(a))

    def ptr(self, t):
        return t.data.ptr

    def empty(self, shape, dtype):
        return self.cupy.empty(shape, dtype)

    def get(self, t):
        self.cupy.cuda.Device().synchronize()
        return self.cupy.asnumpy(t)

    def stream(self):
        return self.cupy.cuda.get_current_stream().ptr


def _device():
    """(device, None) or (None, why not)."""
    reasons = []
    try:
        import torch

        if torch.cuda.is_available():
            return TorchDevice(), None
        reasons.append("torch.cuda.is_available() is False")
    except ImportError:
        reasons.append("PyTorch is not installed")
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return CupyDevice(), None
        reasons.append("CuPy sees no GPU")
    except ImportError:
        reasons.append("CuPy is not installed")
    except Exception as e:  # CuPy without a driver raises CUDARuntimeError
        reasons.append(f"CuPy: {e}")
    return None, "no CUDA GPU usable from Python: " + "; ".join(reasons)


def _nvcc():
    found = shutil.which("nvcc")
    if not found and os.environ.get("CUDA_HOME"):
        cand = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        found = cand if os.access(cand, os.X_OK) else None
    if not found:
        check = cuda_ctypes.check_cuda_module()
        tools = check.find_ready_tools()
        found = check.nvcc_path(tools) if tools else None
    return found


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    dev, why = _device()
    if dev is None:
        pytest.skip(why)
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, $CUDA_HOME/bin, or `python csrc/check_cuda.py`'s cache)")
    out = str(tmp_path_factory.mktemp("cuda_kernels"))
    libs = cuda_ctypes.kernel_libraries(list(cuda_ctypes.LAUNCHERS), out, dev.arch, nvcc)
    fns = {kernel: cuda_ctypes.load(libs[kernel], kernel) for kernel in cuda_ctypes.LAUNCHERS}
    print(f"[cuda kernels] {dev.name} on sm_{dev.arch}, nvcc {nvcc}")
    return dev, fns


# float tolerances per (op, output): the GPU uses __expf / rsqrtf and another summation order
TOL = {("attention", "out"): 1e-4, ("attention", "k_cache"): 1e-5, ("sample", "logprobs"): 1e-4,
       ("swiglu", "out"): 1e-4}


@pytest.mark.parametrize("name", [c["name"] for c in CASES])
def test_cuda_kernel_matches_cpu_kernel(gpu, name):
    dev, fns = gpu
    case = next(c for c in CASES if c["name"] == name)
    got = cuda_ctypes.run_case(dev, fns, case)
    assert sorted(got) == sorted(case["outputs"])
    for k, want in case["outputs"].items():
        assert got[k].shape == want.shape and got[k].dtype == want.dtype, (name, k)
        if np.issubdtype(want.dtype, np.floating):
            tol = TOL.get((case["op"], k), 1e-5)
            np.testing.assert_allclose(got[k], want, atol=tol, rtol=tol, err_msg=f"{name}/{k}")
        else:
            np.testing.assert_array_equal(got[k], want, err_msg=f"{name}/{k}")


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-2), ("bfloat16", 6e-2)])
def test_low_precision_rms_norm_and_swiglu(gpu, dtype, tol):
    dev, fns = gpu
    if dev.name != "torch":
        pytest.skip("float16 / bfloat16 inputs are built with PyTorch (CuPy has no bfloat16)")
    torch = dev.torch
    tdt = getattr(torch, dtype)
    checked = 0
    for case in CASES:
        if case["op"] not in ("rms_norm", "swiglu") or "residual" in case["inputs"]:
            continue
        low = {k: torch.from_numpy(v).to(tdt) for k, v in case["inputs"].items()}
        # the float32 reference of the rounded inputs: what the kernel sees
        rounded = dict(case, inputs={k: v.float().numpy() for k, v in low.items()})
        ref = cuda_ctypes.run_case(dev, fns, rounded)["out"]
        d = {k: v.cuda() for k, v in low.items()}
        a, x = case["attrs"], rounded["inputs"]["x"]
        if case["op"] == "rms_norm":
            H = x.shape[0] if a["cols"] else x.shape[-1]
            out = torch.empty(x.shape, dtype=tdt, device="cuda")
            status = fns["rms_norm"](cuda_ctypes.DTYPE[dtype], d["x"].data_ptr(), None, d["w"].data_ptr(),
                                     out.data_ptr(), x.size // H, H, a["eps"], int(a["cols"]), dev.stream())
            cuda_ctypes.expect_success(status, "rms_norm")
        else:
            if "y" in d:
                mode, shape = 0, x.shape
            elif a["cols"]:
                mode, shape = 2, (x.shape[0] // 2, x.shape[1])
            else:
                mode, shape = 1, x.shape[:-1] + (x.shape[-1] // 2,)
            out = torch.empty(shape, dtype=tdt, device="cuda")
            status = fns["swiglu"](cuda_ctypes.DTYPE[dtype], d["x"].data_ptr(),
                                   d["y"].data_ptr() if "y" in d else None, out.data_ptr(), int(np.prod(shape)),
                                   shape[-1], mode, dev.stream())
            cuda_ctypes.expect_success(status, "swiglu")
        torch.cuda.synchronize()
        np.testing.assert_allclose(out.float().cpu().numpy(), ref, atol=tol, rtol=tol, err_msg=case["name"])
        checked += 1
    assert checked >= 4
