"""A seccomp-BPF filter for the sandboxed child (loaded by ppo/sandbox/child.py by path).

The filter, installed with ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)`` after
``PR_SET_NO_NEW_PRIVS``, holds for the calling process and everything it starts:

- ``socket()`` only for ``AF_INET`` and ``AF_INET6`` (which the network namespace confines):
  no unix socket can be made, so no ``connect`` to a pathname or abstract unix socket of the
  host (a database, a container daemon, syslog), and no netlink, packet or vsock socket either;
- ``socketpair()`` only for ``AF_UNIX`` ``SOCK_STREAM`` (what ``asyncio`` and
  ``multiprocessing`` use: a connected pair reaches nothing outside, and a stream socket
  refuses a destination address);
- no ``io_uring`` (its requests open and connect sockets without passing through this
  filter), ``ptrace``, ``process_vm_readv``/``process_vm_writev``, ``pidfd_getfd`` (reading or
  taking over another process of the same user), ``bpf``, ``perf_event_open``, ``userfaultfd``;
- no system call of another ABI (i386 or x32 numbers on x86-64): such a call kills the process,
  so the 32-bit ``socketcall`` multiplexer cannot bypass the checks above.

Every refused call fails with ``EPERM``. x86-64 and arm64 only; elsewhere
:func:`install_filter` returns False and the caller says so.
"""
import ctypes
import errno
import os
import struct
import sys

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# name -> (x86-64 number, arm64 number), from the kernels' syscall tables.
_SYSCALLS = {
    "socket": (41, 198), "socketpair": (53, 199), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "pidfd_getfd": (438, 438),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
}
REFUSED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "io_uring_setup", "io_uring_enter",
           "io_uring_register", "bpf", "perf_event_open", "userfaultfd")
_X32_BIT = 0x40000000
AF_UNIX, AF_INET, AF_INET6, SOCK_STREAM = 1, 2, 10, 1
_SOCK_TYPE_MASK = 0xF  # the type without SOCK_NONBLOCK / SOCK_CLOEXEC

_LD_W_ABS, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06
_RET_ALLOW, _RET_KILL_PROCESS = 0x7FFF0000, 0x80000000
_RET_EPERM = 0x00050000 | errno.EPERM
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (low 32 bits of each argument)
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def _stmt(code, k):
    return (code, 0, 0, k)


def _jump(code, k, jt, jf):
    return (code, jt, jf, k)


def filter_program(machine=None):
    """The BPF program as a list of (code, jt, jf, k) for `machine` (``os.uname().machine``);
    None where the architecture is not known here."""
    machine = machine or os.uname().machine
    if machine not in _AUDIT_ARCH:
        return None
    col = 0 if machine == "x86_64" else 1
    nr = {name: numbers[col] for name, numbers in _SYSCALLS.items()}
    allow, eperm = _stmt(_RET, _RET_ALLOW), _stmt(_RET, _RET_EPERM)
    prog = [_stmt(_LD_W_ABS, _ARCH), _jump(_JEQ, _AUDIT_ARCH[machine], 1, 0), _stmt(_RET, _RET_KILL_PROCESS),
            _stmt(_LD_W_ABS, _NR)]
    if machine == "x86_64":
        prog += [_jump(_JGE, _X32_BIT, 0, 1), _stmt(_RET, _RET_KILL_PROCESS)]
    refused = [nr[name] for name in REFUSED]
    for i, number in enumerate(refused):  # each: equal -> the EPERM two after the socket checks
        prog.append(_jump(_JEQ, number, len(refused) - i + 2, 0))
    prog += [_jump(_JEQ, nr["socket"], 3, 0), _jump(_JEQ, nr["socketpair"], 7, 0), allow, eperm]
    # socket(family, ...): AF_INET and AF_INET6 only
    prog += [_stmt(_LD_W_ABS, _ARG0), _jump(_JEQ, AF_INET, 2, 0), _jump(_JEQ, AF_INET6, 1, 0), eperm, allow]
    # socketpair(family, type, ...): AF_UNIX with SOCK_STREAM only
    prog += [_stmt(_LD_W_ABS, _ARG0), _jump(_JEQ, AF_UNIX, 1, 0), eperm, _stmt(_LD_W_ABS, _ARG1),
             _stmt(_AND, _SOCK_TYPE_MASK), _jump(_JEQ, SOCK_STREAM, 0, 1), allow, eperm]
    return prog


def install_filter():
    """True when the filter now holds for this process and its future children."""
    prog = filter_program()
    if prog is None or not sys.platform.startswith("linux"):
        return False
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Prog(len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        return False
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0
