"""Run Python code that a model wrote in a child process with limits.

:func:`run_python` writes the code to ``main.py`` in a fresh temporary directory and runs it
with this interpreter in a child process that

- starts in its own session (process group), and is killed with every process of that group
  (``SIGKILL``) when the wall-clock limit passes, and after it ends (leftover children);
- has POSIX resource limits set before the code is read: CPU seconds (``RLIMIT_CPU``: the
  kernel sends ``SIGXCPU``, then ``SIGKILL``), address space (``RLIMIT_AS``), size of any file
  written (``RLIMIT_FSIZE``: its stdout and stderr go to files, so the output is bounded too),
  open files (``RLIMIT_NOFILE``) and no core dumps;
- runs with ``python -I`` (no ``PYTHON*`` variables, no user site-packages, the working
  directory not on ``sys.path``) in a clean environment: ``PATH``, ``HOME`` and ``TMPDIR`` (the
  temporary directory), a UTF-8 locale and one thread for math libraries; nothing of the
  parent's environment (tokens, keys, proxy settings) is passed on;
- cannot write outside its temporary directory where the kernel has Landlock (Linux >= 5.13
  with the Landlock LSM enabled): creating, writing, truncating, renaming, linking or removing
  any file elsewhere fails with a permission error (``/dev/null`` stays writable; reading is
  not restricted). ``SandboxResult.fs_isolated`` says whether that worked, and
  ``SandboxLimits(require_fs_isolation=True)`` makes its absence an error;
- has no network where the kernel allows it cheaply: on Linux it enters new user and network
  namespaces (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``, or ``CLONE_NEWNET`` alone as root),
  which leave it only a loopback device that is down. ``SandboxResult.network_isolated`` says
  whether that worked; where it did not (namespaces disabled, macOS) the code can reach the
  network, and ``SandboxLimits(require_no_network=True)`` makes that an error instead;
- has its output read back truncated to ``output_bytes`` per stream (decoded as UTF-8 with
  replacement characters).

What it does NOT protect against (use a container or VM for hostile code):

- reading the file system: the code runs as the same user as the caller and can read whatever
  that user can: checkpoints, data, the source of this repository, files holding credentials
  (and, where Landlock is missing, write outside its temporary directory too);
- a process that leaves its process group (``setsid``/daemonising) escapes the kill of the
  group; ``RLIMIT_CPU`` still ends each process after its CPU seconds, but nothing else does;
- fork bombs: the number of processes is not limited (``RLIMIT_NPROC`` counts every process
  of the user, the caller's included);
- memory that is not address space of the child (``/dev/shm``, files within the size limit);
- a program that inspects the harness it runs in (its own ``main.py``) to fake a verdict
  printed from inside the same process (see ``ppo.verifiers.code``);
- Windows: there is no ``resource`` module, and :func:`run_python` raises ``SandboxUnavailable``.

A failure of the sandbox itself (no ``resource`` module, the interpreter cannot start, no
network isolation with ``require_no_network``) raises :class:`SandboxUnavailable`; what the
code does (exceptions, exit codes, limits hit) is reported in :class:`SandboxResult`, never
raised. This module imports nothing of this repository and no paddle, so a tool-calling agent
or a reward server can reuse it.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Mapping, Optional

CODE_FILE = "main.py"
STATUS_FILE = ".sandbox_status.json"

# Runs inside the child, before the code: namespaces, Landlock, limits, then the code as __main__.
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
_NO_NETWORK_EXIT, _NO_FS_ISOLATION_EXIT = 97, 98


class SandboxUnavailable(RuntimeError):
    """The sandbox itself could not run (not the code in it): no POSIX resource limits on this
    platform, the interpreter did not start, or no network isolation where it was required."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. Defaults suit a unit-test style check of a short program."""

    wall_s: float = 10.0  # wall-clock seconds before the process group is killed
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU) of each process
    memory_mb: int = 1024  # address space (RLIMIT_AS) of each process
    output_bytes: int = 64 * 1024  # per stream read back; also the largest file the code may write
    max_open_files: int = 64
    network: bool = False  # True: do not try to cut the network off
    require_no_network: bool = False  # True: raise SandboxUnavailable where the network cannot be cut off
    require_fs_isolation: bool = False  # True: raise SandboxUnavailable where writes outside its directory stay possible

    def __post_init__(self):
        if not (self.wall_s > 0 and self.cpu_s >= 1 and self.memory_mb >= 64 and self.output_bytes >= 1):
            raise ValueError(f"sandbox limits out of range: {self}")


@dataclass
class SandboxResult:
    """What the code did. `returncode` is negative (-signal) when a signal ended it and None
    when the wall-clock limit killed it (`timed_out`)."""

    returncode: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool
    cpu_limit_hit: bool
    stdout_truncated: bool
    stderr_truncated: bool
    network_isolated: bool
    wall_s: float
    fs_isolated: bool = False

    @property
    def ok(self):
        """Exited with status 0 within the limits."""
        return self.returncode == 0 and not self.timed_out


def clean_environment(workdir):
    """The whole environment the child gets: nothing of the caller's."""
    return {
        "PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    }


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(path, limit):
    """(text, truncated) of the first `limit` bytes of the file at `path`."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def _run_child(workdir, limits, stdin):
    """Start the launcher in `workdir`, wait within the wall limit, kill the group; returns
    (returncode or None, timed_out, wall seconds)."""
    status = os.path.join(workdir, STATUS_FILE)
    cfg = {"network": limits.network, "require_no_network": limits.require_no_network, "status": status,
           "require_fs_isolation": limits.require_fs_isolation,
           "cpu_s": int(limits.cpu_s), "memory_bytes": int(limits.memory_mb) << 20,
           "output_bytes": int(limits.output_bytes) + 1, "max_open_files": int(limits.max_open_files),
           "code": CODE_FILE}
    paths = [os.path.join(workdir, name) for name in (".stdin", ".stdout", ".stderr")]
    with open(paths[0], "w", encoding="utf-8") as f:
        f.write(stdin or "")
    start = time.monotonic()
    with open(paths[0], "rb") as fin, open(paths[1], "wb") as fout, open(paths[2], "wb") as ferr:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", _CHILD, json.dumps(cfg)], cwd=workdir, env=clean_environment(workdir),
                stdin=fin, stdout=fout, stderr=ferr, start_new_session=True, close_fds=True,
            )
        except OSError as err:
            raise SandboxUnavailable(f"cannot start the sandboxed interpreter {sys.executable}: {err}") from err
        try:
            returncode, timed_out = proc.wait(timeout=limits.wall_s), False
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            returncode, timed_out = None, True
        finally:
            _kill_group(proc.pid)  # children the code left behind in its group
    return returncode, timed_out, time.monotonic() - start


def run_python(code: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
               files: Optional[Mapping[str, str]] = None) -> SandboxResult:
    """Run `code` as ``main.py`` in a fresh temporary directory (with `files`, name -> text,
    beside it) under `limits`, `stdin` on its standard input; see the module docstring."""
    if os.name != "posix":
        raise SandboxUnavailable("the sandbox needs POSIX resource limits (Linux or macOS)")
    with tempfile.TemporaryDirectory(prefix="ppo-sandbox-") as workdir:
        for name, text in {**(files or {}), CODE_FILE: code}.items():
            path = os.path.join(workdir, name)
            if os.path.dirname(os.path.normpath(name)) or name.startswith("."):
                raise ValueError(f"sandbox file name {name!r} must be a plain name in the working directory")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        returncode, timed_out, wall = _run_child(workdir, limits, stdin)
        status = _read_status(workdir)
        stdout, out_cut = _read_capped(os.path.join(workdir, ".stdout"), limits.output_bytes)
        stderr, err_cut = _read_capped(os.path.join(workdir, ".stderr"), limits.output_bytes)
    if returncode == _NO_NETWORK_EXIT and limits.require_no_network and not status["network_isolated"]:
        raise SandboxUnavailable("the network could not be cut off here (no user/network namespaces) and "
                                 "require_no_network is set")
    if returncode == _NO_FS_ISOLATION_EXIT and limits.require_fs_isolation and not status["fs_isolated"]:
        raise SandboxUnavailable("writes outside the sandbox's directory could not be refused here (no Landlock) and "
                                 "require_fs_isolation is set")
    return SandboxResult(
        returncode=returncode, stdout=stdout, stderr=stderr, timed_out=timed_out,
        cpu_limit_hit=returncode == -signal.SIGXCPU, stdout_truncated=out_cut, stderr_truncated=err_cut,
        network_isolated=status["network_isolated"], wall_s=wall, fs_isolated=status["fs_isolated"],
    )


def _read_status(workdir):
    """What the child's start achieved (all False when it ended before writing its status)."""
    try:
        with open(os.path.join(workdir, STATUS_FILE)) as f:
            status = json.load(f)
        return {k: bool(status[k]) for k in ("network_isolated", "fs_isolated")}
    except (OSError, ValueError, KeyError):
        return {"network_isolated": False, "fs_isolated": False}
