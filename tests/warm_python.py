"""A warm interpreter for tests that start `python script.py ...`, `python -c CODE ...` or
`python -m module ...`: one zygote per test process imports Paddle, PaddleNLP and the entry
modules once (running no Paddle op, starting no thread pool), then forks a child per command.

The child is a real separate process: it takes the command's cwd, environment (os.environ
replaced), sys.argv and sys.path[0], stdin from /dev/null, stdout/stderr to the caller's files,
runs the script as `__main__` and exits as `python` would (SystemExit codes, exit 1 after the
traceback of an uncaught exception, -N when killed by signal N). `run` and `Popen` mirror
subprocess's; they fall back to a real subprocess for what a fork cannot reproduce: another
interpreter, interpreter options, `paddle.distributed`, stdin data, unknown keyword arguments,
or an environment that differs from this process's in variables read while importing
(`IMPORT_TIME_ENV`; a zygote is started with the first command's). WARM_PYTHON=0 turns it off.
The zygote collects and freezes its objects before forking (gc.freeze): a child's collections
then do not copy its heap.

What a child does not reproduce: warnings printed while importing the preloaded modules outside
the entry scripts' `quiet_third_party_warnings` (a fresh `python -c "import paddle"` prints
them), a hash seed of its own (children share the zygote's), and `sys.modules` holding the
preloaded modules before the script imports them: a test that patches a function before the
import that binds it calls `rebind` after patching.
"""
import atexit
import gc
import locale
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import types

import paddle  # noqa: F401  (os.environ then holds what Paddle's import sets, OMP_NUM_THREADS among them)

try:
    from tests.warm_client import import_time_env, send_request, zygote_env_path
except ImportError:  # run as the zygote's script: tests/ is sys.path[0]
    from warm_client import import_time_env, send_request, zygote_env_path

SELF = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(SELF))
PRELOAD = ("ppo.run_ppo", "sft.run_sft", "sft.merge_lora", "rm.run_reward", "rm.audit_reward", "dpo.run_dpo",
           "dpo.run_online_dpo", "ppo.reward_server", "tp_cpu_collectives")
FALLBACK_MODULES = ("paddle.distributed",)
_zygotes = {}


class _Zygote:
    def __init__(self, preload, env):
        self.dir = tempfile.mkdtemp(prefix="warm_python_")
        self.sock_path = os.path.join(self.dir, "sock")
        self.env = env
        json.dump(import_time_env(env), open(zygote_env_path(self.sock_path), "w"))
        out, err = (open(os.path.join(self.dir, name), "w+b") for name in ("out", "err"))
        self.proc = subprocess.Popen([sys.executable, SELF, self.sock_path, ",".join(preload)],
                                     cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        out.close()
        err.close()
        ready = os.path.join(self.dir, "ready")
        while not os.path.exists(ready):  # the zygote writes it after the imports
            if self.proc.poll() is not None:
                raise RuntimeError("warm_python zygote died: " + open(os.path.join(self.dir, "err")).read()[-3000:])
            select.select([], [], [], 0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def stop_all():
    while _zygotes:
        _zygotes.popitem()[1].stop()


atexit.register(stop_all)


def _zygote(preload, env):
    """The zygote importing `preload` with `env`'s import-time variables, started by the first command
    that asks for it."""
    key = (preload, tuple(sorted(import_time_env(env).items())))
    if key not in _zygotes or _zygotes[key].proc.poll() is not None:
        _zygotes[key] = _Zygote(preload, env)
    return _zygotes[key]


def launch_socket(env, preload=PRELOAD):
    """The socket of the zygote for `env` (started now if needed), for `paddle.distributed.launch`
    workers to run in (tests/tp_entry.py with WARM_LAUNCH_SOCK); None with WARM_PYTHON=0."""
    if os.environ.get("WARM_PYTHON", "1") == "0":
        return None
    return _zygote(preload, dict(env)).sock_path


def rebind(original, replacement, packages=("ppo", "sft", "rm", "dpo", "paddlenlp")):
    """Points the module globals and function defaults that hold `original` in the loaded modules of
    `packages` at `replacement`: what they hold in a real process that imports them after a test's
    patch (`from x import f`, `def g(save=paddle.save)`), where a zygote child has them loaded before."""
    def defaults(fn):
        fn = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
        if isinstance(fn, types.FunctionType) and fn.__defaults__:
            fn.__defaults__ = tuple(replacement if d is original else d for d in fn.__defaults__)
        if isinstance(fn, types.FunctionType) and fn.__kwdefaults__:
            fn.__kwdefaults__ = {k: replacement if d is original else d for k, d in fn.__kwdefaults__.items()}

    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in packages:
            continue
        for key, value in list(vars(module).items()):
            if value is original:
                setattr(module, key, replacement)
            for member in vars(value).values() if isinstance(value, type) else [value]:
                defaults(member)


def _servable(cmd, env, kw, launcher=False):
    """Whether a zygote child runs `cmd` as `python` would: this interpreter, no option but -c/-m, no
    distributed launch unless `launcher` (tests/tp_launch.py's, whose workers are zygote children
    too), and the import-time variables of this process (else the test sets them)."""
    if os.environ.get("WARM_PYTHON", "1") == "0" or kw or len(cmd) < 2:
        return False
    if import_time_env(env) != import_time_env(os.environ):
        return False
    if os.path.abspath(cmd[0]) != os.path.abspath(sys.executable):  # (a symlink to it leaves the venv)
        return False
    if cmd[1] == "-m":
        return len(cmd) > 2 and (launcher or not cmd[2].startswith(FALLBACK_MODULES))
    return cmd[1] == "-c" and len(cmd) > 2 or not cmd[1].startswith("-")


class Popen:
    """`subprocess.Popen` for a command a zygote child runs: pid, poll, wait, send_signal, kill,
    terminate, communicate; stdout/stderr PIPE (read at exit), DEVNULL, STDOUT, a file or None."""

    def __init__(self, cmd, cwd=None, env=None, stdout=None, stderr=None, text=False, preload=PRELOAD):
        env = dict(os.environ if env is None else env)
        self.args, self.returncode, self.text, self._files, self._close = list(cmd), None, text, {}, []
        zygote = _zygote(preload, env)
        fds = [self._target("stdout", stdout, 1), None]
        fds[1] = fds[0] if stderr == subprocess.STDOUT else self._target("stderr", stderr, 2)
        self._sock, self._reply = send_request(zygote.sock_path, cmd[1:], cwd or os.getcwd(), env, fds)
        for fd in self._close:
            os.close(fd)
        self.pid = int(self._reply.readline())
        self.stdout = self.stderr = None

    def _target(self, name, how, std_fd):
        if how is None:
            return std_fd
        if how == subprocess.PIPE:
            self._files[name] = tempfile.TemporaryFile()
            return self._files[name].fileno()
        if how == subprocess.DEVNULL:
            self._close.append(os.open(os.devnull, os.O_WRONLY))
            return self._close[-1]
        return how if isinstance(how, int) else how.fileno()

    def poll(self):
        if self.returncode is None and select.select([self._sock], [], [], 0)[0]:
            self.wait()
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            if not select.select([self._sock], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            line = self._reply.readline()
            if not line:
                raise RuntimeError("warm_python: the zygote's waiter went away")
            self.returncode = int(line)
            self._reply.close()
            self._sock.close()
        return self.returncode

    def send_signal(self, signum):
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def _read(self, name):
        f = self._files.pop(name, None)
        if f is None:
            return None
        f.seek(0)
        data = f.read()
        f.close()
        return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n") if self.text else data

    def communicate(self, timeout=None):
        self.wait(timeout)
        return self._read("stdout"), self._read("stderr")


def run(cmd, cwd=None, env=None, capture_output=False, text=False, timeout=None, check=False, stdout=None,
        stderr=None, preload=PRELOAD, launcher=False, **kw):
    """`subprocess.run(cmd, ...)`, in a zygote child where it can be run faithfully (`launcher`: a
    `paddle.distributed.launch` command too)."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    env = dict(os.environ if env is None else env)
    if not _servable(cmd, env, kw, launcher):
        return subprocess.run(cmd, cwd=cwd, env=env, text=text, timeout=timeout, check=check, stdout=stdout,
                              stderr=stderr, **kw)
    proc = Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text, preload=preload)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def popen(cmd, cwd=None, env=None, stdout=None, stderr=None, text=False, preload=PRELOAD, **kw):
    """`subprocess.Popen(cmd, ...)`, in a zygote child where it can be run faithfully."""
    env = dict(os.environ if env is None else env)
    if not _servable(cmd, env, kw):
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text, **kw)
    return Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text, preload=preload)


# ---- the zygote side ----

def _reap():
    """Waits for the waiters that have finished (their CPU time then counts in the zygote's children's)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _wait_runner(pid, conn, kill_on_disconnect):
    """The wait status of the runner `pid`; with `kill_on_disconnect`, SIGKILL it first if the
    caller's end of `conn` closes (a launch worker killed by its launcher)."""
    if not kill_on_disconnect:
        return os.waitpid(pid, 0)[1]
    pidfd = os.pidfd_open(pid)  # readable when the runner exits
    while pidfd not in select.select([pidfd, conn], [], [])[0]:
        if not conn.recv(1):  # the caller went away: its child goes too
            os.kill(pid, signal.SIGKILL)
            break
    os.close(pidfd)
    return os.waitpid(pid, 0)[1]


def _serve(sock_path, preload, base_path):
    """Import `preload`, then fork a waiter per request; returns (in the runner child only) the request."""
    own_path0 = sys.path[0]
    out_start = [os.lseek(fd, 0, os.SEEK_CUR) for fd in (1, 2)]
    for name in filter(None, preload.split(",")):
        __import__(name)
    sys.stdout.flush()
    sys.stderr.flush()
    printed = []  # what the imports printed: each child prints it first, as its own imports would
    for fd, start in zip((1, 2), out_start):
        printed.append(os.pread(fd, os.lseek(fd, 0, os.SEEK_CUR) - start, start))
    base_path += [p for p in sys.path if p not in base_path and p not in (ROOT, own_path0)]
    gc.collect()
    gc.freeze()  # the children's collections then skip these objects (no copy of the heap on write)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(16)
    listener.settimeout(1.0)
    parent = os.getppid()
    open(os.path.join(os.path.dirname(sock_path), "ready"), "w").close()
    while os.getppid() == parent:
        _reap()
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        conn.settimeout(None)
        try:
            header, fds, _, _ = socket.recv_fds(conn, 8, 2)
            (size,) = struct.unpack("!Q", header)
            data = b""
            while len(data) < size:
                chunk = conn.recv(size - len(data))
                if not chunk:
                    raise OSError("the caller went away")
                data += chunk
        except (OSError, struct.error):
            conn.close()
            continue
        if os.fork() == 0:  # the waiter: forks the runner, reports its pid and exit status
            listener.close()
            pid = os.fork()
            if pid == 0:
                conn.close()
                for fd, std_fd in zip(fds, (1, 2)):
                    os.dup2(fd, std_fd)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                for fd in set(fds) | {null}:
                    if fd > 2:
                        os.close(fd)
                return data, base_path, printed
            try:
                for fd in fds:
                    os.close(fd)
                conn.sendall(b"%d\n" % pid)
                status = _wait_runner(pid, conn, json.loads(data).get("kill_on_disconnect", False))
                conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
            finally:
                os._exit(0)
        conn.close()
        for fd in fds:
            os.close(fd)
    sys.exit(0)


def _run_request(request, base_path, printed):
    """Runs the command in this (runner) process as `python ARGV...` would, then exits."""
    import runpy

    request = json.loads(request)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a fresh process draws its own numpy seed
    for fd, text in zip((1, 2), printed):
        os.write(fd, text)
    argv = request["argv"]
    if argv[0] == "-c":
        sys.argv, path0 = ["-c", *argv[2:]], ""
    elif argv[0] == "-m":
        sys.argv, path0 = [argv[1], *argv[2:]], os.getcwd()
    else:
        sys.argv, path0 = list(argv), os.path.dirname(os.path.realpath(argv[0]))
    sys.path[:] = [path0, *base_path]
    main = types.ModuleType("__main__")  # a fresh one: `-m` runs the module in sys.modules["__main__"]
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    try:
        if argv[0] == "-c":
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            runpy._run_module_as_main(argv[1])
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:  # as python prints it: the traceback from the script's frames
        tb = error.__traceback__
        ours = (SELF,) if argv[0] == "-m" else (SELF, runpy.__file__, "<frozen runpy>")  # as `python -m` shows
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        error.__traceback__ = tb or error.__traceback__
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)


if __name__ == "__main__":
    _base_path = sys.path[1:]
    sys.path.insert(1, ROOT)
    _run_request(*_serve(sys.argv[1], sys.argv[2], _base_path))
