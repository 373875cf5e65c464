"""The start of a sandboxed child (run by ppo/sandbox.py as ``python -I sandbox_child.py CONFIG``).

Before the code is read it, in this order: leaves the network (new user and network
namespaces, or a network namespace alone as root), takes away writes outside its working
directory (a Landlock ruleset: creating, writing, truncating, renaming, linking or removing
files anywhere else is refused; ``/dev/null`` stays writable; reading is not restricted),
writes what worked into the status file, sets the resource limits, and runs ``main.py`` as
``__main__``. Imports nothing of this repository (it runs with ``-I``: no ``sys.path`` entry
of the caller's).
"""
import ctypes
import json
import os
import resource
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


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def leave_network():
    """True when the process now has a network namespace of its own (only a loopback that is down)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    for flags in (0x10000000 | 0x40000000, 0x40000000):  # CLONE_NEWUSER | CLONE_NEWNET, CLONE_NEWNET
        if libc.unshare(flags) == 0:
            return True
    return False


def _allow(libc, ruleset, path, access):
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneath(access, fd)
        return libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) == 0
    finally:
        os.close(fd)


def restrict_writes_to(workdir):
    """True when every write outside `workdir` (and /dev/null) is now refused by Landlock."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    if abi < 1:
        return False
    handled = _WRITES_ABI1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(handled)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if ruleset < 0:
        return False
    try:
        ok = _allow(libc, ruleset, workdir, handled)
        ok = ok and _allow(libc, ruleset, "/dev/null", handled & (_WRITE_FILE | _TRUNCATE))
        ok = ok and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        return bool(ok and libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) == 0)
    finally:
        os.close(ruleset)


def set_limits(cfg):
    cpu = cfg["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, value in (("RLIMIT_AS", cfg["memory_bytes"]), ("RLIMIT_FSIZE", cfg["output_bytes"]),
                        ("RLIMIT_NOFILE", cfg["max_open_files"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))


def main():
    cfg = json.loads(sys.argv[1])
    network_isolated = False if cfg["network"] else leave_network()
    fs_isolated = restrict_writes_to(os.getcwd())
    with open(cfg["status"], "w") as f:
        json.dump({"network_isolated": network_isolated, "fs_isolated": fs_isolated}, f)
    if cfg["require_no_network"] and not network_isolated:
        sys.exit(NO_NETWORK_EXIT)
    if cfg["require_fs_isolation"] and not fs_isolated:
        sys.exit(NO_FS_ISOLATION_EXIT)
    set_limits(cfg)
    sys.argv = [cfg["code"]]
    import runpy

    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
