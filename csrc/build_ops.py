"""Build the rollout engine's custom ops (one command, idempotent).

    python csrc/build_ops.py            # build if sources/flags/paddle changed, else do nothing
    python csrc/build_ops.py --force    # rebuild
    python csrc/build_ops.py --check    # exit 0 if the built library is up to date, 1 otherwise
    python csrc/build_ops.py --no-cache # compile every object (see "Reuse" below)
    python csrc/build_ops.py --jobs N   # N compiles at a time (default: the CPU count)

The library goes to `csrc/build/ppo_rollout_ops/ppo_rollout_ops.so` (git-ignored) and is
loaded from there by `ppo.kernels` (so nothing is installed into site-packages; any
process that imports `ppo` from this checkout finds it). The C++ CPU kernels in `cpu/` are
always built; only when `paddle.is_compiled_with_cuda()` are the plain-CUDA kernels
`cuda/*.cu` (API `cuda/ppo_cuda.h`, no Paddle headers) and their thin Paddle bindings
`cuda/*_binding.cc` added, and `PPO_WITH_CUDA` defined so the CPU dispatchers call the bindings
for GPU tensors. `python csrc/check_cuda.py` compiles all of them without a GPU. Without the
library the engine runs the same algorithm in pure Paddle and logs one notice.

Reuse. Paddle's `cpp_extension` builds the library (its flags, include folders and link line,
as `cpp_extension.load` would), but each object comes from `object_cache.ObjectCache` when an
identical compile ran before, in any checkout or venv: `~/.cache/paddle-align/cpu-objects`, or
`$PPO_CPU_OBJECT_CACHE`. The key is the command line with the checkout's csrc/ (the build folder too) and
the venv's paths as placeholders, Paddle's version and commit, the compiler's `--version`, Python's
version and the contents of csrc/*.h, every file under csrc/cpu (and csrc/cuda in a CUDA build)
and the source; failed compiles are never stored; objects unused for 30 days are deleted. The
library is linked fresh every time: it records the venv's absolute path in its RUNPATH.

The build stamp (`build_stamp.json`) hashes the sources' contents and their names relative to
csrc/, never absolute paths, so a moved or re-cloned checkout keeps its build up to date.

Ops (each with its pure-Paddle twin in `ppo/rollout/fallback.py` and a test in
`tests/test_ops_*.py`): rollout_rms_norm, rollout_add_rms_norm, rollout_attention (RoPE +
in-place KV-cache write + masked attention), rollout_sample (penalty/min-length/temperature/
top-k/top-p sampling with log-prob output), rollout_update (stop flags, lengths, outputs).
"""
import argparse
import functools
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

CSRC = os.path.dirname(os.path.abspath(__file__))
if CSRC not in sys.path:
    sys.path.insert(0, CSRC)
from object_cache import ObjectCache, cache_dir, prune, source_of  # noqa: E402

CACHE_ENV = "PPO_CPU_OBJECT_CACHE"
NAME = "ppo_rollout_ops"
BUILD_DIR = os.path.join(CSRC, "build")
LIB_DIR = os.path.join(BUILD_DIR, NAME)
LIB_PATH = os.path.join(LIB_DIR, NAME + ".so")
STAMP_PATH = os.path.join(LIB_DIR, "build_stamp.json")
OPENMP_RUNTIME = "libiomp5.so"


def _paddle_libs():
    import paddle

    return os.path.join(os.path.dirname(paddle.__file__), "libs")


def openmp_runtime():
    """The OpenMP runtime the library links: Paddle's own `libiomp5.so` (MKL's, which also serves
    GCC's `GOMP_*` calls) where Paddle ships it, so that the kernels' threads and MKL's matmuls
    share one pool; linked with GCC's libgomp instead, the two runtimes' spinning workers fought
    over the cores (the GRPO step 4x slower at two threads). `libgomp` where Paddle has no libiomp5."""
    return "libiomp5" if os.path.exists(os.path.join(_paddle_libs(), OPENMP_RUNTIME)) else "libgomp"


def _openmp_link_args():
    if openmp_runtime() == "libiomp5":
        return ["-L" + _paddle_libs(), "-liomp5"]  # found at run time through the RUNPATH Paddle's build sets
    return ["-fopenmp"]


def _cpu_flags():
    """-mavx2 -mfma when this CPU has them. Never -march=native: some CPUs here advertise
    AVX-512 that then faults at run time, and AVX2+FMA is what the kernels need. -fopenmp: the
    kernels split their outer loops over OMP_NUM_THREADS threads (the runtime linked:
    `openmp_runtime`)."""
    flags = ["-O3", "-std=c++17", "-fno-math-errno", "-fopenmp"]
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
        "openmp_runtime": openmp_runtime(),
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


def cache_inputs(with_cuda):
    """The files whose contents key every cached object: csrc/*.h, csrc/cpu/* (and csrc/cuda/*)."""
    files = glob.glob(os.path.join(CSRC, "*.h")) + glob.glob(os.path.join(CSRC, "cpu", "*"))
    return files + (glob.glob(os.path.join(CSRC, "cuda", "*")) if with_cuda else [])


class BuildError(RuntimeError):
    """The library did not build (the message carries the compiler's output)."""


def _cached_spawn(spawn, cache, cmd, **kwargs):
    """The compiler's `spawn` for Paddle's build: each compile (`-c`) goes through `cache`; the
    link runs as usual (always fresh: the library records the venv's path in its RUNPATH)."""
    from setuptools.errors import ExecError  # distutils' DistutilsExecError, which the compiler expects

    if "-c" not in cmd:
        return spawn(cmd, **kwargs)
    rc, out = cache.run(cmd)
    if out:
        print(out, file=sys.stderr)
    if rc != 0:
        raise ExecError(f"compiling {source_of(cmd)} failed (exit {rc})")
    return None


def paddle_setup(with_cuda, cxx_flags, cache_root):
    """Paddle's `cpp_extension.setup` for the ops, exactly as `cpp_extension.load` writes it
    (flags, include folders, link line, the generated Python stub); run in csrc/build/ by the
    setup script `build()` writes. With `cache_root`, every compile goes through the object cache."""
    from paddle.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension, setup

    defines = ["-DPPO_WITH_CUDA"] if with_cuda else []
    # __FILE__ (PD_CHECK messages) and debug info name csrc/ and the venv relatively, so an
    # object is the same whichever checkout compiled it (not part of the stamp: paths)
    relative = [f"-ffile-prefix-map={CSRC}=csrc", f"-ffile-prefix-map={sys.prefix}=venv"]
    cache = ObjectCache(cache_root, cache_inputs(with_cuda)) if cache_root else None

    class CachedBuildExtension(BuildExtension):
        def build_extensions(self):
            if cache is not None:  # copied with the compiler into each of Paddle's compile threads
                self.compiler.spawn = functools.partial(_cached_spawn, self.compiler.spawn, cache)
            super().build_extensions()

    nvcc_flags = ["-O3", "--use_fast_math"] + defines if with_cuda else []
    ext = (CUDAExtension if with_cuda else CppExtension)(
        sources=_sources(with_cuda), include_dirs=[], library_dirs=[], extra_link_args=_openmp_link_args(),
        extra_compile_args={"cxx": cxx_flags + defines + relative, "nvcc": nvcc_flags})
    setup(name=NAME, ext_modules=[ext],
          cmdclass={"build_ext": CachedBuildExtension.with_options(output_dir=LIB_DIR, no_python_abi_suffix=True)})
    if cache is not None:
        print(f"[build_ops] objects: {cache.hits} reused from {cache_root}, {cache.misses} compiled")


SETUP_SCRIPT = """# written by csrc/build_ops.py, run as `python {name} build` in csrc/build/
import sys
sys.path.insert(0, {csrc!r})
import build_ops
build_ops.paddle_setup({with_cuda!r}, {cxx_flags!r}, {cache_root!r})
"""


def _compile_and_link(with_cuda, cxx_flags, jobs, cache_root, verbose):
    """Run Paddle's build of the library in a subprocess (as `load` does), `jobs` compiles at a
    time (Paddle's MAX_JOBS); raises BuildError with its output when it fails."""
    setup_path = os.path.join(BUILD_DIR, f"{NAME}_setup.py")
    with open(setup_path, "w") as f:
        f.write(SETUP_SCRIPT.format(name=os.path.basename(setup_path), csrc=CSRC, with_cuda=with_cuda,
                                    cxx_flags=cxx_flags, cache_root=cache_root))
    env = {**os.environ, "MAX_JOBS": str(jobs)}
    proc = subprocess.run([sys.executable, setup_path, "build"], cwd=BUILD_DIR, env=env,
                          capture_output=True, text=True)
    if verbose:
        print(proc.stdout + proc.stderr)
    else:
        print("".join(line + "\n" for line in proc.stdout.splitlines() if line.startswith("[build_ops]")), end="")
    if proc.returncode != 0 or not os.path.exists(LIB_PATH):
        raise BuildError(f"building {LIB_PATH} failed (exit {proc.returncode}):\n{proc.stderr.strip()[-6000:]}")


def build(force=False, verbose=False, jobs=None, use_cache=True):
    """Compile the ops into csrc/build/ppo_rollout_ops/ unless already up to date; returns the
    .so path. Objects of identical earlier compiles come from the cache (`object_cache`); the
    library is linked fresh every time."""
    import paddle
    from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

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
    t0 = time.time()
    cache_root = cache_dir("cpu-objects", CACHE_ENV) if use_cache else None
    _compile_and_link(with_cuda, cxx_flags, jobs or os.cpu_count() or 1, cache_root, verbose)
    if not load_op_meta_info_and_register_op(LIB_PATH):  # what `load` checked: the ops register
        raise BuildError(f"{LIB_PATH} registers no op")
    write_stamp(stamp)
    if cache_root:
        prune(cache_root)
    print(f"[build_ops] built {LIB_PATH} (cuda={with_cuda}) in {time.time() - t0:.0f} s")
    return LIB_PATH


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build the rollout custom ops into csrc/build/.")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--check", action="store_true", help="only report whether the build is up to date")
    parser.add_argument("--verbose", action="store_true", help="show compiler output")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: the CPU count)")
    parser.add_argument("--no-cache", action="store_true",
                        help="compile every object (default: reuse objects of identical compiles)")
    args = parser.parse_args(argv)
    if args.check:
        ok = is_up_to_date()
        print(f"[build_ops] {'up to date' if ok else 'needs build'}: {LIB_PATH}")
        return 0 if ok else 1
    try:
        build(force=args.force, verbose=args.verbose, jobs=args.jobs, use_cache=not args.no_cache)
    except BuildError as e:
        print(f"[build_ops] ERROR: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
