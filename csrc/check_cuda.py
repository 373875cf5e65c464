"""Compile every CUDA source of csrc/ without a GPU (CI check; also the toolchain of the GPU tests).

    python csrc/check_cuda.py                 # install the tools if needed, compile, exit 1 on an error
    python csrc/check_cuda.py --no-bindings   # only the plain-CUDA kernels (smaller download)
    python csrc/check_cuda.py --print-tools   # print the cache directory and exit
    python csrc/check_cuda.py --no-cache      # compile everything, reusing no cached object

1. Tools. `nvcc`, the CUDA runtime headers and CCCL come from PyPI (NVIDIA's `nvidia-cuda-nvcc`,
   `nvidia-cuda-runtime`, `nvidia-cuda-cccl` wheels, pinned below) and are installed with
   `pip install --target` into a cache OUTSIDE the checkout: `$PPO_CUDA_TOOLS`, else
   `~/.cache/paddle-align/cuda-tools/<pin hash>`. The Paddle bindings also need the headers of
   cuBLAS, cuDNN, cuFFT, cuRAND, cuSPARSE and cuSOLVER (Paddle's `phi/core/enforce.h` includes them
   when `PADDLE_WITH_CUDA` is defined); only the `include/` folders of those wheels are kept (the
   wheels unpack to ~2.3 GB of libraries that a compile check never links). A complete cache
   is marked by `tools.json`; a second run downloads nothing.
2. Kernels. Each plain-CUDA file `csrc/cuda/*.cu` (no Paddle headers) is compiled for sm_80 and
   sm_90 with every warning an error (`-Werror all-warnings`, host side `-Wall -Wextra -Werror`).
3. Bindings. Each `csrc/cuda/*_binding.cc` and each CPU dispatcher `csrc/cpu/*.cc` is compiled
   (`-c`, `-Wall -Werror`) the way Paddle's cpp_extension compiles the .cc files of a CUDA
   extension: `-DPADDLE_WITH_CUDA -DEIGEN_USE_GPU -DPADDLE_WITH_CUSTOM_KERNEL`, C++17, Paddle's
   include folders (its ATen compatibility folders included) plus the CUDA headers above, and
   `-DPPO_WITH_CUDA`, so the dispatch to the bindings is compiled too. Paddle and CUDA headers are
   passed as system include folders: their own warnings are not ours to fix. Nothing is linked
   (the CPU wheel's libpaddle lacks the CUDA symbols); instead `nm` checks that every `...CUDA`
   function a dispatcher calls is defined by a binding with the same signature, and every
   `ppo_cuda_*` launcher a binding calls is defined by a kernel object.
4. Reuse. An object whose compile read exactly the same inputs before (same command, same
   csrc/ sources and headers, same Paddle version and host compiler: `object_cache.ObjectCache`)
   is taken from `~/.cache/paddle-align/cuda-objects` (or `$PPO_CUDA_OBJECT_CACHE`) instead of
   compiled again; the symbol check still
   runs on every object. A CI run with unchanged CUDA sources takes seconds instead of minutes.

The GPU kernel tests (tests/test_cuda_kernels.py) use `nvcc_command` / `build_kernel_library`
from here to build each kernel as its own shared library.
"""
import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

CSRC = os.path.dirname(os.path.abspath(__file__))
if CSRC not in sys.path:
    sys.path.insert(0, CSRC)
from object_cache import ObjectCache, cache_dir, run_command as _run  # noqa: E402

CUDA_DIR = os.path.join(CSRC, "cuda")
ARCHS = ("80", "90")

# nvcc and what it needs to compile plain CUDA (installed with their dependencies: crt, nvvm).
COMPILER_PINS = ("nvidia-cuda-nvcc==13.5.37", "nvidia-cuda-runtime==13.5.37", "nvidia-cuda-cccl==13.3.5.0.6")
# Header-only use: only `nvidia/*/include/` of these wheels is extracted.
BINDING_HEADER_PINS = (
    "nvidia-cublas==13.10.0.20",
    "nvidia-cudnn-cu13==9.28.1.4",
    "nvidia-cufft==12.5.0.14",
    "nvidia-curand==10.4.5.25",
    "nvidia-cusparse==12.9.4.2",
    "nvidia-cusolver==12.4.1.2",
)
NVCC_WARNINGS = ["-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"]


class ToolsUnavailable(RuntimeError):
    """The CUDA tools could not be installed (no network, no PyPI)."""


def _pins_key(with_bindings):
    pins = COMPILER_PINS + (BINDING_HEADER_PINS if with_bindings else ())
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]


def default_tools_dir(with_bindings=True):
    if os.environ.get("PPO_CUDA_TOOLS"):
        return os.path.abspath(os.environ["PPO_CUDA_TOOLS"])
    base = os.path.join(os.path.expanduser("~"), ".cache", "paddle-align", "cuda-tools")
    return os.path.join(base, _pins_key(with_bindings))


def _cuda_root(tools_dir):
    return os.path.join(tools_dir, "nvidia", "cu13")


def tools_ready(tools_dir, with_bindings=True):
    """True when `tools_dir` holds a complete install for these pins (its tools.json says so)."""
    stamp = os.path.join(tools_dir, "tools.json")
    if not os.path.exists(stamp):
        return False
    with open(stamp) as f:
        got = json.load(f)
    want = list(COMPILER_PINS) + (list(BINDING_HEADER_PINS) if with_bindings else [])
    return all(p in got.get("pins", []) for p in want)


def _pip(args, log):
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolsUnavailable(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    log(f"[check_cuda] pip {' '.join(args[:2])} ... ok")


def install_tools(tools_dir, with_bindings=True, log=print):
    """Install the pinned tools into `tools_dir` (atomically: a temporary sibling, then a rename)."""
    if tools_ready(tools_dir, with_bindings):
        return tools_dir
    parent = os.path.dirname(tools_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    t0 = time.time()
    try:
        log(f"[check_cuda] installing {', '.join(COMPILER_PINS)} into {tools_dir}")
        _pip(["install", "--quiet", "--disable-pip-version-check", "--no-input", "--target", tmp, *COMPILER_PINS], log)
        if with_bindings:
            wheels = os.path.join(tmp, ".wheels")
            log(f"[check_cuda] fetching headers of {', '.join(BINDING_HEADER_PINS)}")
            _pip(["download", "--quiet", "--disable-pip-version-check", "--no-input", "--no-deps",
                  "--only-binary", ":all:", "--dest", wheels, *BINDING_HEADER_PINS], log)
            for whl in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
                with zipfile.ZipFile(whl) as z:
                    for name in z.namelist():
                        parts = name.split("/")
                        if len(parts) > 3 and parts[0] == "nvidia" and parts[2] == "include" and not name.endswith("/"):
                            z.extract(name, tmp)
            shutil.rmtree(wheels)
        nvcc = os.path.join(_cuda_root(tmp), "bin", "nvcc")
        if not os.access(nvcc, os.X_OK):
            raise ToolsUnavailable(f"the nvcc wheel did not provide {nvcc}")
        pins = list(COMPILER_PINS) + (list(BINDING_HEADER_PINS) if with_bindings else [])
        with open(os.path.join(tmp, "tools.json"), "w") as f:
            json.dump({"pins": pins, "installed_s": round(time.time() - t0, 1)}, f, indent=1)
        if os.path.exists(tools_dir):
            shutil.rmtree(tools_dir)
        os.rename(tmp, tools_dir)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"[check_cuda] tools ready in {time.time() - t0:.0f} s")
    return tools_dir


def find_ready_tools():
    """A complete tool cache (with the binding headers or without), or None: for tests that must
    not download anything."""
    for with_bindings in (True, False):
        d = default_tools_dir(with_bindings)
        if tools_ready(d, with_bindings):
            return d
    return None


def nvcc_path(tools_dir):
    return os.path.join(_cuda_root(tools_dir), "bin", "nvcc")


def kernel_sources():
    """The plain-CUDA files (csrc/cuda/*.cu), sorted."""
    return sorted(glob.glob(os.path.join(CUDA_DIR, "*.cu")))


def binding_sources():
    """The Paddle-side C++ of a CUDA build: the bindings and the CPU dispatchers that call them."""
    bindings = sorted(glob.glob(os.path.join(CUDA_DIR, "*_binding.cc")))
    return bindings + sorted(glob.glob(os.path.join(CSRC, "cpu", "*.cc")))


def nvcc_command(nvcc, src, out, arch, shared=False, include_dirs=(), werror=True, extra=()):
    """The nvcc command line for one plain-CUDA file: an object (`-c`) or, with `shared`, a
    standalone shared library exposing its extern "C" launcher (the GPU tests load it).
    `werror`: every warning an error (the compile check; GPU tests with another nvcc turn it off).
    `extra`: more flags (a bench's `-D` variants of a kernel's tuning macros)."""
    cmd = [nvcc, "-std=c++17", "-O3", f"-arch=sm_{arch}", *(NVCC_WARNINGS if werror else []), "-Xcompiler", "-fPIC"]
    cmd += [f"-I{d}" for d in include_dirs] + list(extra)
    cmd += ["-shared", "-o", out, src] if shared else ["-c", "-o", out, src]
    return cmd


def compile_kernels(tools_dir, out_dir, sources=None, archs=ARCHS, jobs=2, cache=None):
    """Compile each plain-CUDA file for each arch; returns a list of (label, ok, output)."""
    nvcc = nvcc_path(tools_dir)
    inc = [os.path.join(_cuda_root(tools_dir), "include")]
    todo = []
    for src in sources or kernel_sources():
        for arch in archs:
            obj = os.path.join(out_dir, f"{os.path.basename(src)}.sm_{arch}.o")
            cmd = nvcc_command(nvcc, src, obj, arch, include_dirs=inc)
            todo.append((f"{os.path.relpath(src, CSRC)} sm_{arch}", cmd))
    return _run_all(todo, jobs, cache)


def _paddle_include_dirs():
    import paddle

    root = paddle.sysconfig.get_include()
    # the folders Paddle's cpp_extension passes (extension_utils._get_all_paddle_includes_from_include_root)
    return [root, os.path.join(root, "third_party"), os.path.join(root, "paddle/phi/api/include/compat"),
            os.path.join(root, "paddle/phi/api/include/compat/torch/csrc/api/include")]


def _cuda_include_dirs(tools_dir):
    dirs = sorted(glob.glob(os.path.join(tools_dir, "nvidia", "*", "include")))
    cccl = os.path.join(_cuda_root(tools_dir), "include", "cccl")
    return dirs + ([cccl] if os.path.isdir(cccl) else [])


def host_cxx():
    return os.environ.get("CXX") or "c++"


def compile_bindings(tools_dir, out_dir, sources=None, jobs=2, cxx=None, cache=None):
    """Compile the Paddle-side C++ of a CUDA build (see the module docstring); (label, ok, output) list."""
    import sysconfig

    cxx = cxx or host_cxx()
    system = _paddle_include_dirs() + _cuda_include_dirs(tools_dir) + [sysconfig.get_paths()["include"]]
    flags = ["-std=c++17", "-O0", "-fPIC", "-fopenmp", "-Wall", "-Werror", "-DPADDLE_WITH_CUDA", "-DEIGEN_USE_GPU",
             "-DPADDLE_WITH_CUSTOM_KERNEL", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DPPO_WITH_CUDA"]
    for d in system:
        flags += ["-isystem", d]
    todo = []
    for src in sources or binding_sources():
        obj = os.path.join(out_dir, os.path.relpath(src, CSRC).replace(os.sep, "_") + ".o")
        todo.append((os.path.relpath(src, CSRC), [cxx, *flags, "-c", "-o", obj, src]))
    return _run_all(todo, jobs, cache)


def _symbols(obj, kind):
    """Symbol names of an object file: kind "defined" or "undefined" (nm -P)."""
    rc, out = _run(["nm", "-P", f"--{kind}-only", obj])
    if rc != 0:
        raise RuntimeError(f"nm failed on {obj}: {out}")
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def check_symbols(out_dir):
    """The three layers fit together without linking: every `...CUDA` function the CPU
    dispatchers call is defined by a binding (same C++ signature), and every `ppo_cuda_*`
    launcher a binding calls is defined by a kernel object. Returns (label, ok, output) list."""
    objs = sorted(glob.glob(os.path.join(out_dir, "*.o")))
    kernel_objs = [o for o in objs if ".cu.sm_" in o]
    binding_objs = [o for o in objs if o.endswith("_binding.cc.o")]
    cpu_objs = [o for o in objs if os.path.basename(o).startswith("cpu_")]
    defined_k = set().union(*(_symbols(o, "defined") for o in kernel_objs)) if kernel_objs else set()
    defined_b = set().union(*(_symbols(o, "defined") for o in binding_objs)) if binding_objs else set()
    results = []
    for objs_, defined, pick, what in ((cpu_objs, defined_b, lambda n: "CUDA" in n, "binding"),
                                       (binding_objs, defined_k, lambda n: n.startswith("ppo_cuda_"), "kernel")):
        for o in objs_:
            wanted = sorted(n for n in _symbols(o, "undefined") if pick(n))
            missing = [n for n in wanted if n not in defined]
            label = f"symbols of {os.path.basename(o)[:-2]}: {len(wanted)} {what} function(s)"
            results.append((label, not missing, "undefined: " + ", ".join(missing) if missing else ""))
    return results


def cached_inputs():
    """The files whose contents key every cached object (see `object_cache.ObjectCache`)."""
    return (glob.glob(os.path.join(CSRC, "*.h")) + glob.glob(os.path.join(CSRC, "cpu", "*"))
            + glob.glob(os.path.join(CSRC, "cuda", "*")))


def _run_all(todo, jobs, cache=None):
    """Run each (label, command) of `todo`, `jobs` at a time; with a `cache` (see `ObjectCache`),
    a command whose inputs it has compiled before gets that object back instead."""
    run = cache.run if cache else _run
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda item: run(item[1]), todo))
    return [(label, rc == 0, out) for (label, _), (rc, out) in zip(todo, results)]


def build_kernel_library(src, out_dir, arch, nvcc=None, werror=True, cache=None, extra=(), tag=""):
    """Build one plain-CUDA file as a shared library (for ctypes); returns its path. Raises
    RuntimeError with nvcc's output when it does not compile. With a `cache` (an `ObjectCache`
    whose paths map `out_dir`), the library of an identical earlier build is copied instead.
    `extra` flags and a `tag` in the file name build a variant beside the plain library."""
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        raise RuntimeError("nvcc not found")
    out = os.path.join(out_dir, f"lib{os.path.splitext(os.path.basename(src))[0]}{tag}_sm{arch}.so")
    cmd = nvcc_command(nvcc, src, out, arch, shared=True, werror=werror, extra=extra)
    rc, text = (cache.run if cache else _run)(cmd)
    if rc != 0:
        raise RuntimeError(f"nvcc failed on {src}:\n{text}")
    return out


def _report(results, log):
    bad = [r for r in results if not r[1]]
    for label, ok, out in results:
        log(f"[check_cuda] {'ok  ' if ok else 'FAIL'} {label}")
        if not ok:
            log(out)
    return not bad


def main(argv=None):
    parser = argparse.ArgumentParser(description="Compile csrc/'s CUDA sources without a GPU.")
    parser.add_argument("--no-bindings", action="store_true", help="skip the Paddle bindings (smaller download)")
    parser.add_argument("--tools", default=None, help="tool cache directory (default: $PPO_CUDA_TOOLS or ~/.cache/...)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compiles")
    parser.add_argument("--print-tools", action="store_true", help="print the tool cache directory and exit")
    parser.add_argument("--no-cache", action="store_true",
                        help="compile everything (default: reuse objects of identical compiles, see ObjectCache)")
    args = parser.parse_args(argv)
    with_bindings = not args.no_bindings
    tools = os.path.abspath(args.tools) if args.tools else default_tools_dir(with_bindings)
    if args.print_tools:
        print(tools)
        return 0
    t0 = time.time()
    try:
        install_tools(tools, with_bindings)
    except ToolsUnavailable as e:
        print(f"[check_cuda] ERROR: cannot install the CUDA tools from PyPI: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ppo-cuda-check-") as out_dir:
        cache = None if args.no_cache else ObjectCache(
            cache_dir("cuda-objects", "PPO_CUDA_OBJECT_CACHE"), cached_inputs(), {out_dir: "<out>"}, [host_cxx()])
        ok = _report(compile_kernels(tools, out_dir, jobs=args.jobs, cache=cache), print)
        if with_bindings:
            ok = _report(compile_bindings(tools, out_dir, jobs=args.jobs, cache=cache), print) and ok
            if ok:
                ok = _report(check_symbols(out_dir), print)
    n_k = len(kernel_sources()) * len(ARCHS)
    n_b = len(binding_sources()) if with_bindings else 0
    status = "passed" if ok else "FAILED"
    reused = f" ({cache.hits} objects of identical compiles reused)" if cache else ""
    print(f"[check_cuda] {status}: {n_k} kernel compiles (sm_{', sm_'.join(ARCHS)}), {n_b} binding compiles{reused}, "
          f"{time.time() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
