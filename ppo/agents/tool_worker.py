"""Tool calls in worker processes: the tools environment's ``tool_isolation`` "process".

A worker is a Python process of its own (``sys.executable``, the caller's ``sys.path``, a
session of its own) that has imported ``ppo.agents`` before it takes calls, so that starting it
never counts against a tool's timeout. A call sends the tool's function (pickled by reference:
a module-level function, or a ``functools.partial`` of one with its options) and its arguments,
and the worker sends back :func:`ppo.agents.tool_results.call_outcome` -- the conversion of the result
to text happens in the worker. What the tool prints goes to the worker's standard error, never
into the answer.

- A call that runs past its timeout: the worker's whole session is killed (``SIGKILL``), the
  call is a timeout (``None``), and the next call gets a new worker.
- A tool that ends its process (``os._exit``, a segmentation fault, the OOM killer): the call
  comes back ``("crashed", "ended its worker process (exit status N)")``; the trainer goes on.

Workers are kept for the next calls (at most ``MAX_WORKERS`` at a time, a call waits for a free
one) and killed when the trainer exits; a worker whose trainer died without that (SIGKILL)
notices within a second (its parent changed) and ends itself, and what it started with it.
"""
import atexit
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time

from .tool_results import call_outcome

MAX_WORKERS = max(1, min(8, os.cpu_count() or 1))
START_TIMEOUT_S = 600.0
_READY = b"ready\n"


class _Worker:
    """One worker process and its pipes."""

    def __init__(self):
        boot = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
                "from ppo.agents.tool_worker import serve; serve()")
        self.proc = subprocess.Popen([sys.executable, "-c", boot, json.dumps(sys.path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        if not self._wait_readable(START_TIMEOUT_S) or self.proc.stdout.readline() != _READY:
            self.kill()
            raise RuntimeError(f"the tool worker process did not start (exit status {self.proc.poll()})")

    def _wait_readable(self, timeout_s):
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout_s, 0.0))
        return bool(ready)

    def call(self, payload, timeout_s):
        """The outcome of the pickled call `payload` in this worker; None at the timeout (the
        worker killed)."""
        try:
            _write_frame(self.proc.stdin, payload)
        except (BrokenPipeError, OSError):
            return self._crashed()
        if not self._wait_readable(timeout_s):
            self.kill()
            return None
        data = _read_frame(self.proc.stdout)
        return self._crashed() if data is None else pickle.loads(data)

    def _crashed(self):
        self.kill()
        return ("crashed", f"ended its worker process (exit status {self.proc.poll()})")

    @property
    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and whatever it started
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


class _Pool:
    """Idle workers handed out one call at a time, at most MAX_WORKERS alive."""

    def __init__(self):
        self.idle, self.busy, self.started = [], 0, []
        self.cond = threading.Condition()

    def acquire(self):
        with self.cond:
            while not self.idle and self.busy >= MAX_WORKERS:
                self.cond.wait()
            self.busy += 1
            worker = self.idle.pop() if self.idle else None
        if worker is None:
            try:
                worker = _Worker()
            except BaseException:
                self.release(None)
                raise
            with self.cond:
                self.started = [w for w in self.started if w.alive] + [worker]
        return worker

    def release(self, worker):
        with self.cond:
            self.busy -= 1
            if worker is not None and worker.alive:
                self.idle.append(worker)
            self.cond.notify()

    def close(self):
        """Kill every worker (idle or running a call)."""
        with self.cond:
            started, self.started, self.idle = self.started, [], []
        for worker in started:
            worker.kill()


_POOL = _Pool()
atexit.register(_POOL.close)


def run_in_worker(fn, arguments, timeout_s):
    """fn(**arguments) in a worker process (see the module docstring): the outcome of
    ``call_outcome``, ``("crashed", message)``, or None when it ran past `timeout_s`."""
    try:
        payload = pickle.dumps((fn, arguments))
    except Exception as err:  # noqa: BLE001 - a lambda or closure cannot travel to a worker
        return ("raised", type(err).__name__, f"cannot run in a worker process: {err}"[:200])
    worker = _POOL.acquire()
    try:
        return worker.call(payload, timeout_s)
    finally:
        _POOL.release(worker)


def _write_frame(stream, data):
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _read_frame(stream):
    """One frame's bytes, or None at the end of the stream."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    data = stream.read(int.from_bytes(head, "little"))
    return data if len(data) == int.from_bytes(head, "little") else None


def serve():
    """The worker's loop: read a pickled (fn, arguments), write call_outcome(fn, arguments), until EOF."""
    parent = os.getppid()
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the tool's prints go to standard error, never into the protocol
    sys.stdout = sys.stderr
    channel.write(_READY)
    channel.flush()
    while True:
        data = _read_frame(sys.stdin.buffer)
        if data is None:
            return
        try:
            fn, arguments = pickle.loads(data)
        except Exception as err:  # noqa: BLE001 - the tool's module cannot be imported here
            outcome = ("raised", type(err).__name__, f"cannot load the tool in its worker process: {err}"[:200])
        else:
            outcome = call_outcome(fn, arguments)
        try:
            reply = pickle.dumps(outcome)
        except Exception as err:  # noqa: BLE001 - an exception message that does not pickle
            reply = pickle.dumps(("raised", type(err).__name__, str(err)[:200]))
        _write_frame(channel, reply)


def _watch_parent(parent):
    """End this worker's session when the trainer that started it is gone."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(os.getpgid(0), signal.SIGKILL)
