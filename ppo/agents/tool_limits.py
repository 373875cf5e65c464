"""The run's limits on tool calls, and async tools on one shared event loop.

- ``max_concurrent_tool_calls`` (0: no cap): at most this many tool calls run at once in this
  process, over every row and every call of a turn (a call waits for a free slot; the wait
  counts against the step's timeout, not the tool's). Each call of the ``python`` tool runs one
  sandboxed child and each call with ``tool_isolation`` "process" holds one worker, so the cap
  is also the most sandboxes / worker processes busy at once.
- ``tool_timeout_s`` (0: each tool's own ``timeout_s``): the timeout of every tool call.

:func:`set_tool_limits` sets both for the process (the multi-turn rollout does, from its
arguments); :func:`call_slot` and :func:`call_timeout` are what ``call_tool`` reads.

An async tool (a coroutine function) runs on one event loop in a daemon thread of its own,
shared by every call: a call that waits (on a socket, a sandbox, ``asyncio.sleep``) holds no
thread, and at its timeout it is cancelled (``asyncio.wait_for``), which a thread cannot be.
"""
import asyncio
import contextlib
import functools
import inspect
import threading

_LOCK = threading.Lock()
_STATE = {"cap": 0, "slots": None, "timeout_s": 0.0, "loop": None}


def set_tool_limits(max_concurrent_tool_calls: int = 0, tool_timeout_s: float = 0.0):
    """Set the process's cap on concurrent tool calls and the timeout of every call (0: none /
    each tool's own). Calls already holding a slot keep it."""
    cap = int(max_concurrent_tool_calls or 0)
    if cap < 0 or not float(tool_timeout_s or 0.0) >= 0:
        raise ValueError(f"tool limits must be >= 0, got {max_concurrent_tool_calls}, {tool_timeout_s}")
    with _LOCK:
        if cap != _STATE["cap"]:
            _STATE["cap"], _STATE["slots"] = cap, threading.BoundedSemaphore(cap) if cap else None
        _STATE["timeout_s"] = float(tool_timeout_s or 0.0)


def call_timeout(own_timeout_s: float) -> float:
    """The timeout of a call to a tool whose own is `own_timeout_s`."""
    with _LOCK:
        return _STATE["timeout_s"] or float(own_timeout_s)


@contextlib.contextmanager
def call_slot():
    """Hold one of the ``max_concurrent_tool_calls`` slots for the duration of a call."""
    with _LOCK:
        slots = _STATE["slots"]
    if slots is None:
        yield
        return
    with slots:
        yield


def is_async(fn) -> bool:
    """Whether `fn` (or the function a ``functools.partial`` wraps) is a coroutine function."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _loop():
    with _LOCK:
        if _STATE["loop"] is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="async-tools", daemon=True).start()
            _STATE["loop"] = loop
        return _STATE["loop"]


def run_async(fn, arguments, timeout_s, outcome):
    """``outcome(fn, arguments)`` of the async tool `fn` run on the shared loop: its result
    converted as a plain function's is; None when it did not finish within `timeout_s` (then
    cancelled)."""

    async def guarded():
        value = await asyncio.wait_for(fn(**arguments), timeout_s)
        return outcome(lambda: value, {})

    async def call():
        try:
            return await guarded()
        except asyncio.TimeoutError:
            return None
        except BaseException as err:  # noqa: BLE001 - reported as the tool's error
            return outcome(_raiser(err), {})

    return asyncio.run_coroutine_threadsafe(call(), _loop()).result()


def _raiser(err):
    def raise_it():
        raise err

    return raise_it
