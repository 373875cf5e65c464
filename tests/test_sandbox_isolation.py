"""The sandbox against four attacks, each judged by what the host saw: a unix socket of the host,
a `setsid` escapee that outlives the call, a fork bomb, and root reading root-only files. A test
skips only where the kernel lacks the layer, with the sandbox's own reason (`notes`)."""
import os
import socket
import stat
import tempfile
import time

import pytest

from ppo.sandbox import SandboxLimits, _result, run_python
from ppo.sandbox.seccomp import filter_program

FAST = SandboxLimits(wall_s=10, cpu_s=3, memory_mb=512)


def alive(pid):
    """Whether `pid` runs (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def host_unix_sockets():
    """A stream listener and a datagram socket at paths anyone may open, and an abstract listener."""
    folder = tempfile.mkdtemp(prefix="ppo-host-sock-", dir="/tmp")
    os.chmod(folder, 0o755)
    stream, dgram, abstract = (socket.socket(socket.AF_UNIX, kind) for kind in
                               (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_STREAM))
    paths = {"stream": os.path.join(folder, "s.sock"), "dgram": os.path.join(folder, "d.sock"),
             "abstract": f"\0ppo-sandbox-test-{os.getpid()}"}
    stream.bind(paths["stream"]), dgram.bind(paths["dgram"]), abstract.bind(paths["abstract"])
    for path in (paths["stream"], paths["dgram"]):
        os.chmod(path, 0o777)
    stream.listen(8), abstract.listen(8)
    for s in (stream, dgram, abstract):
        s.setblocking(False)
    yield paths, {"stream": stream, "dgram": dgram, "abstract": abstract}
    for s in (stream, dgram, abstract):
        s.close()
    for path in (paths["stream"], paths["dgram"]):
        os.unlink(path)
    os.rmdir(folder)


def test_unix_sockets_of_the_host_are_refused(host_unix_sockets):
    paths, listeners = host_unix_sockets
    code = (f"import socket\npaths = {paths!r}\n"
            "for name, kind in (('stream', socket.SOCK_STREAM), ('abstract', socket.SOCK_STREAM), ('dgram', socket.SOCK_DGRAM)):\n"
            "    try:\n        s = socket.socket(socket.AF_UNIX, kind)\n"
            "        s.sendto(b'escaped', paths[name]) if kind == socket.SOCK_DGRAM else (s.connect(paths[name]), s.sendall(b'escaped'))\n"
            "        print(name, 'reached')\n"
            "    except OSError as err:\n        print(name, 'refused', err.errno)\n"
            "a, b = socket.socketpair()\na.sendall(b'pair')\nprint('pair', b.recv(4).decode())")
    result = run_python(code, limits=FAST)
    if not result.unix_sockets_blocked:
        pytest.skip(f"no seccomp filter on this kernel or architecture: {result.notes}")
    for name in ("stream", "abstract"):
        with pytest.raises(BlockingIOError):  # no connection waits to be accepted
            listeners[name].accept()
    with pytest.raises(BlockingIOError):  # no datagram arrived
        listeners["dgram"].recv(64)
    assert result.stdout.splitlines() == ["stream refused 1", "abstract refused 1", "dgram refused 1", "pair pair"]
    assert result.network_isolated == result.unix_sockets_blocked and result.ok


def test_network_isolated_needs_the_unix_socket_filter_too():
    """A network namespace alone leaves the host's pathname unix sockets reachable."""
    def result(**got):
        return _result({"returncode": 0, **got}, 0, FAST, 0.1, "", False, "", False)

    assert not result(network_namespace=True, unix_sockets_blocked=False).network_isolated
    assert not result(network_namespace=False, unix_sockets_blocked=True).network_isolated
    assert result(network_namespace=True, unix_sockets_blocked=True).network_isolated


def test_the_seccomp_program_covers_both_architectures():
    x86, arm = filter_program("x86_64"), filter_program("aarch64")
    assert x86 and arm and len(x86) == len(arm) + 2  # x86-64 also kills x32 system calls
    assert filter_program("riscv64") is None


SETSID_ESCAPEE = """import os, socket, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        s = socket.create_connection(('127.0.0.1', {port}))
        s.sendall(os.readlink('/proc/self').encode() + b'\\n')
        os.write(w, b'x')
        while True:
            time.sleep(0.2)
            s.sendall(b'tick')
    os._exit(0)
os.read(r, 1)
print('escapee started', flush=True)
"""


def test_a_setsid_escapee_dies_when_the_call_returns():
    """The code daemonises a grandchild (setsid, double fork) that keeps talking to a host TCP
    listener; once run_python returns, the host hears nothing more and the process is gone."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        code = SETSID_ESCAPEE.format(port=listener.getsockname()[1])
        result = run_python(code, limits=SandboxLimits(wall_s=10, cpu_s=3, network=True))
        assert result.stdout == "escapee started\n", result
        listener.settimeout(5)
        conn, _ = listener.accept()
        with conn:
            conn.setblocking(False)
            before = conn.recv(65536)  # what it sent before the call returned
            pid = int(before.split(b"\n")[0])
            conn.settimeout(2)
            after = conn.recv(65536)
    assert after == b"", f"the escapee {pid} still sends after the call returned: {after!r}"
    assert not alive(pid)


def test_a_fork_bomb_is_capped():
    """128 forks, each child prints and sleeps: at most `max_processes` processes at once."""
    code = ("import os, time\nforked = refused = 0\nr, w = os.pipe()\nfor _ in range(128):\n    try:\n"
            "        pid = os.fork()\n    except BlockingIOError:\n        refused += 1\n        continue\n"
            "    if pid == 0:\n        print('child', flush=True)\n        os.write(w, b'x')\n        time.sleep(30)\n"
            "        os._exit(0)\n    os.read(r, 1)  # the child has printed\n    forked += 1\n"
            "print('forked', forked, 'refused', refused, flush=True)")
    limits = SandboxLimits(wall_s=20, cpu_s=5, max_processes=16)
    result = run_python(code, limits=limits)
    if not result.processes_capped:
        pytest.skip(f"no process cap here (RLIMIT_NPROC needs a user namespace or a dropped root): {result.notes}")
    lines = result.stdout.splitlines()
    assert lines.count("child") == limits.max_processes - 1  # the code's own process is the 16th
    assert lines[-1] == f"forked {limits.max_processes - 1} refused {128 - limits.max_processes + 1}"


@pytest.mark.skipif(os.geteuid() != 0, reason="the drop from root is tested where the tests run as root")
def test_root_drops_to_nobody_and_cannot_read_root_files():
    secret_dir = tempfile.mkdtemp(prefix="ppo-root-only-")  # mode 0700, owned by root
    secret = os.path.join(secret_dir, "token")
    with open(secret, "w") as f:
        f.write("root-secret-7731")
    os.chmod(secret, stat.S_IRUSR | stat.S_IWUSR)
    code = (f"import json, os, decimal\nopen('mine.txt', 'w').write('ok')\nprint(os.getuid(), open('mine.txt').read())\n"
            f"for op in (lambda: open('/etc/shadow').read(), lambda: os.listdir('/root'), lambda: open({secret!r}).read()):\n"
            "    try:\n        print('read', op())\n    except OSError as err:\n        print('refused', err.errno)")
    try:
        result = run_python(code, limits=FAST)
    finally:
        os.remove(secret)
        os.rmdir(secret_dir)
    assert result.uid == 65534, result.notes
    assert result.stdout.splitlines() == ["65534 ok", "refused 13", "refused 13", "refused 13"], result
    assert "root-secret" not in result.stdout + result.stderr


NO_UNSHARE = """import ctypes, dataclasses, json, platform, struct, sys
# A seccomp filter that refuses unshare() (x86-64: 272, arm64: 97): a kernel without namespaces.
nr = {"x86_64": 272, "aarch64": 97}[platform.machine()]
prog = [(0x20, 0, 0, 0), (0x15, 0, 1, nr), (0x06, 0, 0, 0x50001), (0x06, 0, 0, 0x7FFF0000)]
raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
buf = ctypes.create_string_buffer(raw, len(raw))
fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) == 0
from ppo.sandbox import SandboxLimits, run_python
result = run_python(sys.stdin.read(), limits=SandboxLimits(wall_s=10, cpu_s=3, network=True))
print(json.dumps(dataclasses.asdict(result)))
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="the test's own seccomp filter knows x86-64 and arm64")
def test_without_namespaces_the_subreaper_still_kills_the_escapee():
    """Where unshare() is refused (no user namespaces), the supervisor is a subreaper: the
    daemonised grandchild comes back to it and is killed; the result says what is missing."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        code = SETSID_ESCAPEE.format(port=listener.getsockname()[1])
        out = subprocess.run([sys.executable, "-c", NO_UNSHARE], input=code, capture_output=True, text=True,
                             cwd=root, env={**os.environ, "PYTHONPATH": root})
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["stdout"] == "escapee started\n", result
        listener.settimeout(5)
        conn, _ = listener.accept()
        with conn:
            conn.setblocking(False)
            pid = int(conn.recv(65536).split(b"\n")[0])
            conn.settimeout(2)
            after = conn.recv(65536)
    assert after == b"" and not alive(pid)
    assert not result["pid_namespace"] and not result["network_isolated"]
    assert any("no user namespace" in note for note in result["notes"]), result["notes"]
