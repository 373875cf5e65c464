"""Run Python code that a model wrote in a child process with limits.

:func:`run_python` writes the code to ``main.py`` in a fresh temporary directory and runs it
with this interpreter (``python -I``: no ``PYTHON*`` variables, no user site-packages) in a clean
environment (``PATH``, ``HOME`` and ``TMPDIR`` = that directory, a UTF-8 locale, one math
thread; nothing of the caller's: tokens, keys, proxies). Three processes (ppo/sandbox/child.py):
a launcher that enters namespaces and drops root, a supervisor that ends the code at the
wall-clock limit and kills everything it left, and the code's own. The layers, each where the
kernel allows it; the result says which held, and ``notes`` why one is missing:

- resource limits (POSIX): CPU seconds (``SIGXCPU``), address space, file size (so the
  output too), open files, no core dumps; output read back cut at ``output_bytes``;
- the supervisor (Linux): the code killed at ``wall_s``, then every process it left (as a
  subreaper); the caller kills the process group at ``wall_s`` + 10 s should that fail;
- a pid namespace (``pid_namespace``; user namespaces, or root): every process of the call
  dies with the supervisor, ``setsid`` or not, and none can signal it;
- a network namespace and a seccomp filter (``network_isolated`` when both held; namespaces as
  above, the filter on x86-64 and arm64): no network but a loopback that is down, no unix,
  netlink, packet or vsock socket (so no local service of the host), no io_uring, ptrace,
  ``process_vm_*``, ``pidfd_getfd`` or bpf; ``require_no_network`` makes a gap an error;
- Landlock (``fs_isolated``; Linux >= 5.13): no write, create, rename or remove outside its
  directory (``/dev/null`` excepted); from ABI 6 (6.12) no signal and no abstract unix socket
  out of the sandbox; ``require_fs_isolation`` makes its absence an error;
- a process cap (``processes_capped``): ``RLIMIT_NPROC`` = ``max_processes`` (+ the launcher
  and supervisor), set where the count is the call's own (a user namespace: Linux >= 5.14
  counts per namespace) or the user is ``nobody``; root ignores the limit;
- dropped root (``uid``): a caller running as root runs the code as ``nobody`` without groups
  (``/etc/shadow``, ``/root`` refused); an interpreter under a directory nobody cannot enter
  is bound into an empty tmpfs (mode 0711) laid over that directory in a private mount
  namespace.

The table in docs/agents.md gives each layer's kernel and what happens without it.

What it does NOT protect against (use a container or VM for hostile code):

- reading the file system as the user it runs as: a caller that is not root lends its own
  user, so checkpoints, data, source and credential files that user may read are readable;
  ``/proc`` lists the host's processes and their command lines (their environments and memory
  are refused by the user namespace and by Landlock, each on its own);
- memory that is not address space of the child (``/dev/shm`` where Landlock is missing);
- a program that inspects the harness it runs in (its own ``main.py``) to fake a verdict
  printed from inside the same process (see ``ppo.verifiers.code``);
- kernel exploits; Windows (no ``resource`` module: ``SandboxUnavailable``).

A failure of the sandbox itself (no ``resource`` module, the interpreter cannot start, a
required layer missing) raises :class:`SandboxUnavailable`; what the code does (exceptions,
exit codes, limits hit) is reported in :class:`SandboxResult`, never raised. This module
imports nothing of this repository and no paddle, so a tool-calling agent or a reward server
can reuse it.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

CODE_FILE = "main.py"

# Runs inside the child, before the code: namespaces, Landlock, limits, then the code as __main__.
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
_NO_NETWORK_EXIT, _NO_FS_ISOLATION_EXIT = 97, 98


class SandboxUnavailable(RuntimeError):
    """The sandbox itself could not run (not the code in it): no POSIX resource limits on this
    platform, the interpreter did not start, or no network isolation where it was required."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. Defaults suit a unit-test style check of a short program."""

    wall_s: float = 10.0  # wall-clock seconds before the code is killed, with every process it started
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU) of each process
    memory_mb: int = 1024  # address space (RLIMIT_AS) of each process
    output_bytes: int = 64 * 1024  # per stream read back; also the largest file the code may write
    max_open_files: int = 64
    max_processes: int = 64  # processes and threads at once, the code's own included (RLIMIT_NPROC)
    network: bool = False  # True: keep the network (unix sockets of the host stay refused)
    require_no_network: bool = False  # True: raise SandboxUnavailable where the network cannot be cut off
    require_fs_isolation: bool = False  # True: raise SandboxUnavailable where writes outside its directory stay possible

    def __post_init__(self):
        if not (self.wall_s > 0 and self.cpu_s >= 1 and self.memory_mb >= 64 and self.output_bytes >= 1
                and self.max_processes >= 1):
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
    unix_sockets_blocked: bool = False  # the seccomp filter held: no unix, netlink, packet or vsock socket
    processes_capped: bool = False  # RLIMIT_NPROC held (max_processes)
    pid_namespace: bool = False  # every process of the call died with it, setsid or not (else: a subreaper's kill)
    uid: Optional[int] = None  # the user the code ran as (nobody, 65534, where root was dropped)
    notes: Tuple[str, ...] = ()  # why a layer is missing

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


_BACKSTOP_S = 10.0  # past the wall-clock limit, the caller kills the group itself (the supervisor should have)


def _run_child(workdir, limits, stdin):
    """Start the launcher in `workdir` and wait for it (the supervisor inside ends the code at the
    wall-clock limit; past it plus a margin the group is killed here); returns (what the child
    reported, as one dict, or {} where it said nothing; the launcher's returncode, None where it
    was killed here; wall seconds)."""
    read_fd, write_fd = os.pipe()
    cfg = {"network": limits.network, "require_no_network": limits.require_no_network, "report_fd": write_fd,
           "require_fs_isolation": limits.require_fs_isolation, "wall_s": float(limits.wall_s),
           "cpu_s": int(limits.cpu_s), "memory_bytes": int(limits.memory_mb) << 20,
           "output_bytes": int(limits.output_bytes) + 1, "max_open_files": int(limits.max_open_files),
           "max_processes": int(limits.max_processes), "code": CODE_FILE}
    paths = [os.path.join(workdir, name) for name in (".stdin", ".stdout", ".stderr")]
    with open(paths[0], "w", encoding="utf-8") as f:
        f.write(stdin or "")
    start = time.monotonic()
    try:
        with open(paths[0], "rb") as fin, open(paths[1], "wb") as fout, open(paths[2], "wb") as ferr:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", _CHILD, json.dumps(cfg)], cwd=workdir, env=clean_environment(workdir),
                    stdin=fin, stdout=fout, stderr=ferr, start_new_session=True, close_fds=True, pass_fds=(write_fd,),
                )
            except OSError as err:
                raise SandboxUnavailable(f"cannot start the sandboxed interpreter {sys.executable}: {err}") from err
            finally:
                os.close(write_fd)
            try:
                launcher_rc = proc.wait(timeout=limits.wall_s + _BACKSTOP_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
                launcher_rc = None
            finally:
                _kill_group(proc.pid)
        return _read_report(read_fd), launcher_rc, time.monotonic() - start
    finally:
        os.close(read_fd)


def _read_report(fd):
    """The JSON lines the launcher, supervisor and code's process wrote, merged (never blocks)."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    merged = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            merged.update(json.loads(line))
        except ValueError:
            pass
    return merged


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
        got, launcher_rc, wall = _run_child(workdir, limits, stdin)
        stdout, out_cut = _read_capped(os.path.join(workdir, ".stdout"), limits.output_bytes)
        stderr, err_cut = _read_capped(os.path.join(workdir, ".stderr"), limits.output_bytes)
    return _result(got, launcher_rc, limits, wall, stdout, out_cut, stderr, err_cut)


def _result(got, launcher_rc, limits, wall, stdout, out_cut, stderr, err_cut):
    """The SandboxResult of what the child reported (`got`); raises SandboxUnavailable where a
    required layer is missing or the child never got as far as running the code."""
    if "returncode" not in got and launcher_rc is None:
        got = {**got, "returncode": None, "timed_out": True}
    if "returncode" not in got:
        raise SandboxUnavailable(f"the sandbox did not start the code (launcher exit status {launcher_rc}): "
                                 f"{stderr[-500:]}".rstrip())
    network = bool(got.get("network_namespace") and got.get("unix_sockets_blocked"))
    returncode, timed_out = got["returncode"], bool(got.get("timed_out"))
    if returncode == _NO_NETWORK_EXIT and limits.require_no_network and not network:
        raise SandboxUnavailable("the network could not be cut off here (no network namespace or no seccomp filter "
                                 f"for unix sockets) and require_no_network is set: {got.get('notes')}")
    if returncode == _NO_FS_ISOLATION_EXIT and limits.require_fs_isolation and not got.get("fs_isolated"):
        raise SandboxUnavailable("writes outside the sandbox's directory could not be refused here (no Landlock) and "
                                 "require_fs_isolation is set")
    return SandboxResult(
        returncode=returncode, stdout=stdout, stderr=stderr, timed_out=timed_out,
        cpu_limit_hit=returncode == -signal.SIGXCPU, stdout_truncated=out_cut, stderr_truncated=err_cut,
        network_isolated=network, wall_s=wall, fs_isolated=bool(got.get("fs_isolated")),
        unix_sockets_blocked=bool(got.get("unix_sockets_blocked")),
        processes_capped=bool(got.get("processes_capped")), pid_namespace=bool(got.get("pid_namespace")),
        uid=got.get("uid"), notes=tuple(got.get("notes", ())),
    )
