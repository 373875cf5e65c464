"""The start of a sandboxed child (run by ppo/sandbox/runner.py as ``python -I child.py CONFIG``).

Three processes, each writing what it did as one JSON line to the report pipe (``report_fd``):

- the launcher (this process) enters the namespaces and, as root, drops to ``nobody``
  (ppo/sandbox/ns.py), then waits for
- the supervisor: pid 1 of the new pid namespace (or, without one, a child subreaper), which
  runs the code in a child of its own, ends it at the wall-clock limit, and when it has ended
  kills every process it left behind (``setsid`` does not leave the pid namespace, and orphans
  come back to a subreaper), then reports the code's exit status;
- the code's process: takes away writes outside its working directory (Landlock: creating,
  writing, truncating, renaming, linking or removing files anywhere else is refused;
  ``/dev/null`` stays writable), installs the seccomp filter (ppo/sandbox/seccomp.py: no unix
  socket of the host), sets the resource limits (``RLIMIT_NPROC`` where its count is the
  call's own), reports, closes the pipe and runs ``main.py`` as ``__main__``.

Imports nothing of this repository as a package (it runs with ``-I``); its two siblings are
loaded by path.
"""
import ctypes
import importlib.util
import json
import os
import resource
import signal
import sys

NO_NETWORK_EXIT = 97
NO_FS_ISOLATION_EXIT = 98

# Landlock (Linux >= 5.13), from <linux/landlock.h>; the same syscall numbers on x86-64 and arm64.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_WRITE_FILE, _TRUNCATE = 1 << 1, 1 << 14
_WRITES_ABI1 = _WRITE_FILE | sum(1 << b for b in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_REFER = 1 << 13  # ABI 2: renaming or linking across directories
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1, 2  # ABI 6: no abstract unix socket, no signal out of the domain


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _allow(libc, ruleset, path, access):
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneath(access, fd)
        return libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) == 0
    finally:
        os.close(fd)


def restrict_writes_to(workdir):
    """True when every write outside `workdir` (and /dev/null) is now refused by Landlock; from
    Landlock ABI 6 (Linux 6.12) signals to processes outside the sandbox (the supervisor, the
    caller) and abstract unix sockets are refused too."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    if abi < 1:
        return False
    handled = _WRITES_ABI1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(handled, 0, _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else 8  # older kernels know handled_access_fs only
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        return False
    try:
        ok = _allow(libc, ruleset, workdir, handled)
        ok = ok and _allow(libc, ruleset, "/dev/null", handled & (_WRITE_FILE | _TRUNCATE))
        ok = ok and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        return bool(ok and libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) == 0)
    finally:
        os.close(ruleset)


_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_LINUX = sys.platform.startswith("linux")
_SUPERVISOR_PROCESSES = 2  # the launcher and the supervisor count against RLIMIT_NPROC too


def _sibling(name):
    """The module ppo/sandbox/<name>.py, loaded by path (nothing is added to sys.path)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                      name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report(cfg, facts):
    os.write(cfg["report_fd"], (json.dumps(facts) + "\n").encode())


def set_limits(cfg, nproc):
    cpu = cfg["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    limits = [("RLIMIT_AS", cfg["memory_bytes"]), ("RLIMIT_FSIZE", cfg["output_bytes"]),
              ("RLIMIT_NOFILE", cfg["max_open_files"]), ("RLIMIT_CORE", 0)]
    if nproc:
        limits.append(("RLIMIT_NPROC", nproc))
    for name, value in limits:
        resource.setrlimit(getattr(resource, name), (value, value))


def _nproc_per_namespace():
    """Whether RLIMIT_NPROC counts the processes of each user namespace apart (Linux >= 5.14);
    before, it counts every process of the user, the caller's included. Root ignores it."""
    try:
        return tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2]) >= (5, 14)
    except ValueError:
        return False


def run_code(cfg, facts, seccomp):
    """The code's process: Landlock, seccomp, limits, report; then main.py as a script runs
    (its exit status, traceback, atexit handlers and threads as with ``python main.py``)."""
    fs_isolated = restrict_writes_to(os.getcwd())
    unix_blocked = _LINUX and seccomp.install_filter()
    capped = facts["uid"] != 0 and (facts["privileges_dropped"] or facts["user_namespace"] and _nproc_per_namespace())
    notes = facts["notes"] + [why for held, why in (
        (fs_isolated, "no Landlock (Linux >= 5.13 with the LSM enabled): writes outside the directory stay possible"),
        (unix_blocked, "no seccomp filter (Linux on x86-64 or arm64): unix sockets of the host stay reachable"),
        (capped, "no process cap: RLIMIT_NPROC would count the caller's processes (no user namespace, or Linux "
                 "< 5.14) or is ignored (root)")) if not held]
    report(cfg, {"fs_isolated": fs_isolated, "unix_sockets_blocked": unix_blocked, "processes_capped": capped,
                 "notes": notes})
    os.close(cfg["report_fd"])
    if cfg["require_no_network"] and not (facts["network_namespace"] and unix_blocked):
        sys.exit(NO_NETWORK_EXIT)
    if cfg["require_fs_isolation"] and not fs_isolated:
        sys.exit(NO_FS_ISOLATION_EXIT)
    set_limits(cfg, cfg["max_processes"] + _SUPERVISOR_PROCESSES if capped else 0)
    sys.argv = [cfg["code"]]
    import runpy

    runpy.run_path(sys.argv[0], run_name="__main__")


def _children():
    """Pids of this process's children, from /proc (host pids: use only outside a pid namespace)."""
    me = os.getpid()
    try:
        with open(f"/proc/self/task/{me}/children") as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: every process's parent
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
        return found


def kill_the_rest():
    """Kill and reap every process left below this subreaper, until none is left."""
    while True:
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def supervise(cfg, facts):
    """Start the code's process (True there, at once); in the supervisor: end it at the
    wall-clock limit, kill what it left, report its exit status (False)."""
    if _LINUX:
        ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    code_pid = os.fork()
    if code_pid == 0:
        return True
    timed_out = []

    def on_alarm(*_):
        timed_out.append(True)
        os.kill(code_pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, cfg["wall_s"])
    status = None
    while status is None:
        pid, wait_status = os.waitpid(-1, 0)
        if pid == code_pid:
            status = wait_status
    signal.setitimer(signal.ITIMER_REAL, 0)
    if _LINUX and os.getpid() != 1:  # pid 1 of a pid namespace takes every process in it along when it exits
        kill_the_rest()
    returncode = None if timed_out else os.waitstatus_to_exitcode(status)
    report(cfg, {"returncode": returncode, "timed_out": bool(timed_out)})
    return False


def main():
    cfg = json.loads(sys.argv[1])
    seccomp = _sibling("seccomp")  # both read before the user changes
    facts = _sibling("ns").isolate(os.getcwd(), want_net=not cfg["network"])
    report(cfg, facts)
    supervisor = os.fork()
    if supervisor != 0:
        os.waitpid(supervisor, 0)
        return
    if _LINUX:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        in_code_process = supervise(cfg, facts)
    except BaseException:
        import traceback

        traceback.print_exc()
        in_code_process = False
    if not in_code_process:
        os._exit(0)
    run_code(cfg, facts, seccomp)


if __name__ == "__main__":
    main()
