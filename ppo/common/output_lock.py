"""One run per output directory: `output_dir/run.lock` names the run that holds it.

Two runs writing into one `output_dir` (a job submitted twice) would delete each other's
checkpoints and interleave one `metrics.jsonl`. Every entry point takes the lock at start, on
the main process only, and releases it at exit. The lock file holds the holder's host name and
process id: a second run is refused naming them; a lock left by a run that died on this host
(its process is gone) is taken over with a warning. A lock from another host cannot be checked
from here and is refused (delete the file when that run is known to be over).
"""
import atexit
import json
import logging
import os
import socket
import sys
import time

logger = logging.getLogger("ppo")
LOCK_NAME = "run.lock"


class OutputDirLockedError(RuntimeError):
    """`output_dir` is in use by another live run."""


def process_alive(pid):
    """Whether a process with id `pid` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def read_holder(path):
    """The holder record of the lock file `path` ({} when unreadable: a lock cut short while written)."""
    try:
        with open(path, encoding="utf-8") as f:
            holder = json.load(f)
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe(holder):
    return f"pid {holder.get('pid')} on host {holder.get('host')} (started {holder.get('started', '?')}: {holder.get('command', '?')})"


def _stale_reason(holder, host):
    """Why the lock of `holder` may be taken over (None when its run may still be alive)."""
    if not holder:
        return "its content is unreadable (a lock written by a run killed at start)"
    if holder.get("host") != host:
        return None
    if holder.get("pid") == os.getpid():
        return "this process holds it already"
    if not isinstance(holder.get("pid"), int) or not process_alive(holder["pid"]):
        return f"its holder, {_describe(holder)}, is no longer running"
    return None


def _create_exclusive(path, record):
    """Create `path` holding `record`; False when it already exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
    return True


def acquire_output_dir(output_dir, is_main=None):
    """Take `output_dir/run.lock` for this process (only on the main process, rank 0 unless
    `is_main` says otherwise: other ranks of a multi-process run share its lock) and release it
    at exit; returns the lock path or None. Raises OutputDirLockedError naming the holder when
    another live run has it."""
    if is_main is None:
        import paddle.distributed as dist

        is_main = dist.get_rank() == 0
    if not is_main:
        return None
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_NAME)
    host = socket.gethostname()
    record = {"host": host, "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join(sys.argv)}
    for _ in range(3):  # a lock released or taken over between our two looks: look again
        if _create_exclusive(path, record):
            atexit.register(release_output_dir, path)
            return path
        holder = read_holder(path)
        reason = _stale_reason(holder, host)
        if reason is None:
            raise OutputDirLockedError(
                f"{output_dir} is in use by another run: {_describe(holder)}. Wait for it to finish, choose "
                f"another output_dir, or delete {path} if that run is known to be over."
            )
        if holder.get("pid") != os.getpid():
            logger.warning(f"{path}: taking over a stale lock: {reason}")
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    raise OutputDirLockedError(f"{path}: could not take the lock (another run keeps taking it)")


def release_output_dir(path):
    """Remove the lock file `path` if this process holds it; returns whether it did."""
    if read_holder(path).get("pid") != os.getpid() or read_holder(path).get("host") != socket.gethostname():
        return False
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True
