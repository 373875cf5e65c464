"""Build the rollout engine's custom ops (one command, idempotent).

    python csrc/build_ops.py            # build if sources/flags/paddle changed, else do nothing
    python csrc/build_ops.py --force    # rebuild
    python csrc/build_ops.py --check    # exit 0 if the built library is up to date, 1 otherwise

The library goes to `csrc/build/ppo_rollout_ops/ppo_rollout_ops.so` (git-ignored) and is
loaded from there by `ppo.kernels` (so nothing is installed into site-packages; any
process that imports `ppo` from this checkout finds it). The C++ CPU kernels in `cpu/` are
always built; only when `paddle.is_compiled_with_cuda()` are the plain-CUDA kernels
`cuda/*.cu` (API `cuda/ppo_cuda.h`, no Paddle headers) and their thin Paddle bindings
`cuda/*_binding.cc` added, and `PPO_WITH_CUDA` defined so the CPU dispatchers call the bindings
for GPU tensors. `python csrc/check_cuda.py` compiles all of them without a GPU. Without the
library the engine runs the same algorithm in pure Paddle and logs one notice.

The build stamp (`build_stamp.json`) hashes the sources' contents and their names relative to
csrc/, never absolute paths, so a moved or re-cloned checkout keeps its build up to date.

Ops (each with its pure-Paddle twin in `ppo/rollout/fallback.py` and a test in
`tests/test_ops_*.py`): rollout_rms_norm, rollout_add_rms_norm, rollout_attention (RoPE +
in-place KV-cache write + masked attention), rollout_sample (penalty/min-length/temperature/
top-k/top-p sampling with log-prob output), rollout_update (stop flags, lengths, outputs).
"""
import argparse
import glob
import hashlib
import json
import os
import shutil
import sys

CSRC = os.path.dirname(os.path.abspath(__file__))
NAME = "ppo_rollout_ops"
BUILD_DIR = os.path.join(CSRC, "build")
LIB_DIR = os.path.join(BUILD_DIR, NAME)
LIB_PATH = os.path.join(LIB_DIR, NAME + ".so")
STAMP_PATH = os.path.join(LIB_DIR, "build_stamp.json")


def _cpu_flags():
    """-mavx2 -mfma when this CPU has them. Never -march=native: some CPUs here advertise
    AVX-512 that then faults at run time, and AVX2+FMA is what the kernels need."""
    flags = ["-O3", "-std=c++17", "-fno-math-errno"]
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        cpu = set(info.split("flags")[1].split("\n")[0].split()) if "flags" in info else set()
        if {"avx2", "fma"} <= cpu:
            flags += ["-mavx2", "-mfma"]
    except OSError:
        pass
    return flags


def _sources(with_cuda):
    """Files compiled into the library: CPU kernels, plus CUDA kernels and bindings with CUDA."""
    srcs = sorted(glob.glob(os.path.join(CSRC, "cpu", "*.cc")))
    if with_cuda:
        srcs += sorted(glob.glob(os.path.join(CSRC, "cuda", "*.cu")))
        srcs += sorted(glob.glob(os.path.join(CSRC, "cuda", "*_binding.cc")))
    return srcs


def _headers(with_cuda):
    hdrs = sorted(glob.glob(os.path.join(CSRC, "*.h")))
    if with_cuda:
        hdrs += sorted(glob.glob(os.path.join(CSRC, "cuda", "*.h")) + glob.glob(os.path.join(CSRC, "cuda", "*.cuh")))
    return hdrs


def sources_digest(with_cuda):
    """sha256 over (name relative to csrc/, content) of every source and header, in name order.
    Independent of where the checkout lives: moving or re-cloning it keeps the digest."""
    h = hashlib.sha256()
    files = _sources(with_cuda) + _headers(with_cuda)
    for rel in sorted(os.path.relpath(p, CSRC).replace(os.sep, "/") for p in files):
        h.update(rel.encode() + b"\0")
        with open(os.path.join(CSRC, rel), "rb") as f:
            data = f.read()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _stamp(with_cuda, cxx_flags):
    import paddle

    return {
        "sources_sha256": sources_digest(with_cuda),
        "paddle": paddle.__version__,
        "paddle_commit": getattr(paddle.version, "commit", ""),
        "python": sys.version.split()[0],
        "with_cuda": with_cuda,
        "cxx_flags": cxx_flags,
    }


def current_stamp():
    """What a build from this checkout, with this Paddle and Python, would record."""
    import paddle

    return _stamp(paddle.is_compiled_with_cuda(), _cpu_flags())


def write_stamp(stamp):
    """Record `stamp` (taken before compiling) as what the library at LIB_PATH was built from."""
    with open(STAMP_PATH, "w") as f:
        json.dump(stamp, f, indent=1)


def is_up_to_date():
    if not (os.path.exists(LIB_PATH) and os.path.exists(STAMP_PATH)):
        return False
    with open(STAMP_PATH) as f:
        old = json.load(f)
    return old == current_stamp()


def build(force=False, verbose=False):
    """Compile the ops into csrc/build/ppo_rollout_ops/ unless already up to date; returns the .so path."""
    import paddle
    from paddle.utils.cpp_extension import load

    with_cuda = paddle.is_compiled_with_cuda()
    cxx_flags = _cpu_flags()
    stamp = _stamp(with_cuda, cxx_flags)
    if not force and is_up_to_date():
        if verbose:
            print(f"[build_ops] up to date: {LIB_PATH}")
        return LIB_PATH
    if os.path.exists(LIB_DIR):
        shutil.rmtree(LIB_DIR)
    os.makedirs(BUILD_DIR, exist_ok=True)
    defines = ["-DPPO_WITH_CUDA"] if with_cuda else []
    load(
        name=NAME,
        sources=_sources(with_cuda),
        extra_cxx_cflags=cxx_flags + defines,
        extra_cuda_cflags=["-O3", "--use_fast_math"] + defines if with_cuda else None,
        build_directory=BUILD_DIR,
        verbose=verbose,
    )
    if not os.path.exists(LIB_PATH):
        raise RuntimeError(f"build finished but {LIB_PATH} is missing")
    write_stamp(stamp)
    print(f"[build_ops] built {LIB_PATH} (cuda={with_cuda})")
    return LIB_PATH


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build the rollout custom ops into csrc/build/.")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--check", action="store_true", help="only report whether the build is up to date")
    parser.add_argument("--verbose", action="store_true", help="show compiler output")
    args = parser.parse_args(argv)
    if args.check:
        ok = is_up_to_date()
        print(f"[build_ops] {'up to date' if ok else 'needs build'}: {LIB_PATH}")
        return 0 if ok else 1
    build(force=args.force, verbose=args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
