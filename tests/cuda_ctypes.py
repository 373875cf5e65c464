"""ctypes view of the plain-CUDA launchers (csrc/cuda/ppo_cuda.h), for the kernel tests.

Each csrc/cuda/<kernel>.cu is built on its own as a shared library (csrc/check_cuda.py's
`build_kernel_library`); `load(path, symbol)` returns the launcher with its argument types set,
so a wrong argument count or type is a ctypes error rather than garbage on the device.
"""
import ctypes
import importlib.util
import os

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


def check_cuda_module():
    """csrc/check_cuda.py as a module (csrc/ is not a package)."""
    path = os.path.join(REPO, "csrc", "check_cuda.py")
    spec = importlib.util.spec_from_file_location("_ppo_check_cuda", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load(lib_path, kernel):
    """The launcher of `kernel` (a key of LAUNCHERS) from its standalone library."""
    symbol, argtypes = LAUNCHERS[kernel]
    fn = getattr(ctypes.CDLL(lib_path), symbol)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def host_int64(values):
    """A host int64 array for the launchers' host-side list arguments (None when empty)."""
    values = [int(v) for v in values]
    return (ctypes.c_int64 * len(values))(*values) if values else None
