"""Namespaces and the dropped user of the sandboxed child (loaded by ppo/sandbox/child.py by path).

:func:`isolate` runs in the launcher, before the supervisor and the code are started:

- as root it gives the working directory to ``nobody``, enters new network and pid namespaces
  (root needs no user namespace for them), and drops to ``nobody`` (no supplementary groups):
  root-only files (``/etc/shadow``, ``/root``) are then refused as to any other user. Where the
  interpreter lies behind a directory ``nobody`` cannot enter (a Python under ``/root``), it
  first enters a private mount namespace and lays an empty tmpfs (mode 0711: nothing to list)
  over that directory with only the interpreter's tree bound back into it;
- then (as ``nobody``, or as the unprivileged caller) it enters a new user namespace, with the
  network and pid namespaces still missing. In a user namespace of its own, ``RLIMIT_NPROC``
  counts the processes of this call only (Linux >= 5.14 keeps the count per namespace), so the
  supervisor can cap them; the process that becomes pid 1 of the new pid namespace takes every
  process of the call with it when it exits (``setsid`` or not).

Each step that the kernel refuses is left out and named in ``notes``; the caller reports it.
"""
import ctypes
import os
import stat
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x20000000, 0x10000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
NOBODY = 65534


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _unshare(flags):
    return _libc().unshare(flags) == 0


def nobody_ids():
    """(uid, gid) of ``nobody`` (65534 where the user database has no such entry)."""
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return NOBODY, NOBODY


def _can_enter(path, uid, gid):
    st = os.stat(path)
    bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
    return bool(st.st_mode & bit)


def blocked_passages(paths, uid, gid):
    """{directory: {name, ...}}: the first directory on the way to each of `paths` that
    `uid`/`gid` cannot enter, with the entry below it that leads on."""
    blocked = {}
    for path in paths:
        parts = os.path.realpath(path).strip("/").split("/")
        for depth in range(len(parts)):
            parent = "/" + "/".join(parts[:depth])
            if not _can_enter(parent, uid, gid):
                blocked.setdefault(parent, set()).add(parts[depth])
                break
    return blocked


def _pass_through(directory, names):
    """Lay a tmpfs over `directory` with only `names` bound back into it; True when done."""
    libc = _libc()
    fds = {name: os.open(os.path.join(directory, name), os.O_PATH | os.O_CLOEXEC) for name in names}
    try:
        if libc.mount(b"tmpfs", directory.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0711,size=64k") != 0:
            return False
        for name, fd in fds.items():
            target = os.path.join(directory, name)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(target, 0o755)
            else:
                open(target, "w").close()
            if libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, _MS_BIND | _MS_REC, None) != 0:
                return False
        return True
    finally:
        for fd in fds.values():
            os.close(fd)


def keep_reachable(paths, uid, gid):
    """Make `paths` reachable for `uid`/`gid` (see the module docstring); None when done, else
    why not."""
    blocked = blocked_passages(paths, uid, gid)
    if not blocked:
        return None
    if not _unshare(CLONE_NEWNS) or _libc().mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"{sorted(blocked)} cannot be entered by uid {uid} and there is no private mount namespace"
    for _ in range(8):  # each pass opens one more level where a bound tree holds closed directories
        for directory, names in sorted(blocked.items()):
            if not _pass_through(directory, names):
                return f"cannot lay a tmpfs over {directory}: errno {ctypes.get_errno()}"
        blocked = blocked_passages(paths, uid, gid)
        if not blocked:
            return None
    return f"{sorted(blocked)} stay closed to uid {uid}"


def interpreter_paths(workdir):
    """What the code needs to reach: its directory, this interpreter and its import path."""
    paths = {workdir, sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(p for p in paths | set(sys.path) if p and os.path.isdir(p))


def _root_steps(workdir, want_net, facts):
    """As root: nobody owns `workdir`, namespaces entered, privileges dropped (see above)."""
    uid, gid = nobody_ids()
    for name in [""] + os.listdir(workdir):
        os.chown(os.path.join(workdir, name), uid, gid)
    problem = keep_reachable(interpreter_paths(workdir), uid, gid)
    if problem:
        facts["notes"].append(f"stays root: {problem}")
        return
    if _unshare(CLONE_NEWPID | (CLONE_NEWNET if want_net else 0)):
        facts.update(pid_namespace=True, network_namespace=want_net)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    facts.update(uid=uid, privileges_dropped=True)


def isolate(workdir, want_net):
    """Enter the namespaces and drop root; returns the facts: uid, privileges_dropped,
    user/network/pid_namespace, notes (why a layer is missing)."""
    facts = {"uid": os.geteuid(), "privileges_dropped": False, "user_namespace": False,
             "network_namespace": False, "pid_namespace": False, "notes": []}
    if not sys.platform.startswith("linux"):
        facts["notes"].append("not Linux: no namespaces")
        return facts
    if os.geteuid() == 0:
        _root_steps(workdir, want_net, facts)
    need_net = CLONE_NEWNET if want_net and not facts["network_namespace"] else 0
    need_pid = 0 if facts["pid_namespace"] else CLONE_NEWPID
    for extra in (need_net | need_pid, need_net, need_pid, 0):
        if _unshare(CLONE_NEWUSER | extra):
            facts["user_namespace"] = True
            facts["network_namespace"] = facts["network_namespace"] or bool(extra & CLONE_NEWNET)
            facts["pid_namespace"] = facts["pid_namespace"] or bool(extra & CLONE_NEWPID)
            break
    else:
        facts["notes"].append(f"no user namespace (unshare: errno {ctypes.get_errno()})")
    if need_net and not facts["network_namespace"] and os.geteuid() == 0 and _unshare(CLONE_NEWNET):
        facts["network_namespace"] = True  # root that could not drop its privileges
    return facts
