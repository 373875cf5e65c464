"""Objects of identical earlier compiles, kept outside the checkout and reused (`ObjectCache`).

Used by `build_ops.py` (the CPU ops library; `~/.cache/paddle-align/cpu-objects`) and
`check_cuda.py` (the CUDA compile check; `~/.cache/paddle-align/cuda-objects`). A compile's key
is everything it reads:

- its command line, with the checkout's csrc/ folder, the virtual environment (`sys.prefix`, so
  Paddle's include folders too) and the caller's temporary output folder replaced by
  placeholders, so a fresh clone in another folder or a new venv gets the same key;
- the `--version` text of the compiler that runs (and of any other compiler the caller names,
  e.g. the host compiler behind nvcc);
- the caller's facts: Python's version, Paddle's version and commit;
- the contents and csrc/-relative names of the input files (every file under csrc/cpu, the
  headers csrc/*.h, ...), and the source file itself.

The same key gives the same object, so a hit is the result the compile would give; any edit of
a source or header misses and compiles again. Failed compiles are never stored. `build_ops.py`
maps csrc/ and the venv to relative names in its objects (`-ffile-prefix-map`); a reused CUDA
object's debug information names the folder of the checkout that first compiled it.
"""
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

CSRC = os.path.dirname(os.path.abspath(__file__))
SOURCE_SUFFIXES = (".cc", ".cpp", ".cxx", ".c", ".cu")


def cache_dir(kind, env_var):
    """`$env_var` when set, else `~/.cache/paddle-align/<kind>`."""
    if os.environ.get(env_var):
        return os.path.abspath(os.path.expanduser(os.environ[env_var]))
    return os.path.join(os.path.expanduser("~"), ".cache", "paddle-align", kind)


def run_command(cmd):
    """Run `cmd`; (exit status, stdout + stderr)."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


@functools.lru_cache(maxsize=None)
def compiler_version(exe):
    """`exe --version` (its output whatever the exit status; the error when it cannot run)."""
    try:
        return run_command([exe, "--version"])[1]
    except OSError as e:
        return f"cannot run {exe}: {e}"


def toolchain_facts():
    """Python's version and, when importable, Paddle's version and commit."""
    facts = {"python": sys.version.split()[0]}
    try:
        import paddle
    except ImportError:
        return facts
    facts["paddle"] = paddle.__version__
    facts["paddle_commit"] = getattr(paddle.version, "commit", "")
    return facts


def source_of(cmd):
    """The one source file a compile command reads (an existing file with a C/C++/CUDA suffix)."""
    found = [a for a in cmd if a.endswith(SOURCE_SUFFIXES) and os.path.isfile(a)]
    if len(found) != 1:
        raise ValueError(f"expected one source file in the compile command, found {found}: {cmd}")
    return found[0]


def _compiler_of(cmd):
    """The compiler that runs: the first argument, or the one after a `ccache` prefix."""
    return cmd[1] if os.path.basename(cmd[0]) == "ccache" and len(cmd) > 1 else cmd[0]


def files_digest(paths, base):
    """sha256 over (name relative to `base`, content) of `paths`, in name order."""
    h = hashlib.sha256()
    for rel in sorted(os.path.relpath(p, base).replace(os.sep, "/") for p in paths):
        with open(os.path.join(base, rel), "rb") as f:
            data = f.read()
        h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


class ObjectCache:
    """Objects of successful compiles in `root`, keyed as the module docstring says.

    `inputs`: files whose contents enter every key (named relative to `base`); `paths`: extra
    {folder: placeholder} replacements (e.g. a temporary output folder); `compilers`: compilers
    whose `--version` enters every key besides the one each command runs; `facts`: a
    JSON-serialisable value that enters every key (default `toolchain_facts()`)."""

    def __init__(self, root, inputs, paths=None, compilers=(), facts=None, base=CSRC):
        self.root = root
        subst = {base: "<csrc>", sys.prefix: "<venv>", **(paths or {})}
        # longest first, so a folder inside another (a venv inside the checkout) keeps its name
        self.subst = sorted(subst.items(), key=lambda kv: -len(kv[0]))
        self.fixed = json.dumps({"inputs": files_digest(inputs, base),
                                 "compilers": [compiler_version(c) for c in compilers],
                                 "facts": toolchain_facts() if facts is None else facts}, sort_keys=True)
        self.hits = self.misses = 0
        self._lock = threading.Lock()

    def _placeholders(self, arg):
        for path, name in self.subst:
            arg = arg.replace(path, name)
        return arg

    def key(self, cmd):
        """The key of compile command `cmd` (hex)."""
        text = json.dumps([[self._placeholders(a) for a in cmd], compiler_version(_compiler_of(cmd)), self.fixed])
        with open(source_of(cmd), "rb") as f:
            src = f.read()
        return hashlib.sha256(text.encode() + b"\0" + src).hexdigest()[:32]

    def run(self, cmd):
        """Run compile command `cmd` (`-o OBJ` names its object), or copy the object of an
        identical earlier compile to OBJ; (exit status, compiler output)."""
        cmd = list(cmd)
        obj = cmd[cmd.index("-o") + 1]
        cached = os.path.join(self.root, self.key(cmd) + ".o")
        if os.path.exists(cached):
            shutil.copyfile(cached, obj)
            os.utime(cached)  # recently used: kept by prune()
            with self._lock:
                self.hits += 1
            return 0, ""
        rc, out = run_command(cmd)
        with self._lock:
            self.misses += 1
        if rc == 0:
            os.makedirs(self.root, exist_ok=True)
            tmp = f"{cached}.{os.getpid()}.{threading.get_ident()}.tmp"
            shutil.copyfile(obj, tmp)
            os.replace(tmp, cached)
        return rc, out


def prune(root, max_age_days=30):
    """Delete the objects in cache folder `root` unused (neither stored nor reused) for
    `max_age_days`; returns how many."""
    if not os.path.isdir(root):
        return 0
    cutoff, removed = time.time() - max_age_days * 86400, 0
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.endswith(".o") and os.path.getmtime(path) < cutoff:
            os.remove(path)
            removed += 1
    return removed
