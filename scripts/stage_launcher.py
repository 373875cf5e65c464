"""Starts a stage's entry script before the stage may run, so that its imports (Paddle,
PaddleNLP and the toolkit: about 4 s on a CPU core) overlap the stage it waits for.

    python scripts/stage_launcher.py SCRIPT READY_FILE   # then one JSON line on stdin

Runs SCRIPT's top level under the module name `__prestart__` (its imports; the `if __name__ ==
"__main__"` block does not run), creates READY_FILE, and waits for one line on stdin:
`{"argv": [...]}` runs SCRIPT as `python SCRIPT argv...` would (`sys.argv`, `sys.path[0]` and
`__name__ == "__main__"`), and the process ends with the script's exit status. An empty stdin
(whoever started it is gone) ends the process with status 1 without running the script.
`scripts/stage_scheduler.py` starts the quickstart's stages this way.

When the script ends with status 0, the process skips the interpreter's teardown (about 1.2 s
with Paddle loaded, on the quickstart's critical path): it waits for the script's non-daemon
threads, runs the `atexit` handlers, flushes every open file, then `os._exit(0)`. Any other end
(an exception, a non-zero status) takes Python's usual way out.
"""
import atexit
import gc
import io
import json
import os
import runpy
import sys
import threading

NOT_STARTED_EXIT_CODE = 1


def prepare(script):
    """Make `sys.path[0]` the script's directory, as `python SCRIPT` does, and run its top level."""
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.argv = [script]
    runpy.run_path(script, run_name="__prestart__")


def wait_for_arguments(stream):
    """The argument list of the start line on `stream`, or None when it closes without one."""
    line = stream.readline()
    if not line.strip():
        return None
    argv = json.loads(line)["argv"]
    if not all(isinstance(a, str) for a in argv):
        raise ValueError(f"the start line's argv must be a list of strings, got {argv!r}")
    return argv


def main(argv=None):
    script, ready_file = (sys.argv[1:] if argv is None else argv)
    prepare(script)
    sys.stdout.flush()
    with open(ready_file, "w"):
        pass
    args = wait_for_arguments(sys.stdin)
    if args is None:
        raise SystemExit(NOT_STARTED_EXIT_CODE)
    sys.argv = [script] + args
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise


FILE_TYPES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.FileIO)


def flush_open_files():
    """Flush every open file object the garbage collector tracks (what teardown would flush); by
    exact type, as `isinstance` against the io ABCs takes 0.5 s over a heap with Paddle loaded."""
    for obj in gc.get_objects():
        if type(obj) in FILE_TYPES:
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):  # a detached wrapper, a broken pipe: as teardown, go on
                pass


def exit_without_teardown():
    """End with status 0 as Python would after a finished script, less the teardown."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_without_teardown()  # reached only when the script finished with status 0
