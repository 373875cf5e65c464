"""Starts a stage's entry script before the stage may run, so that its imports (Paddle,
PaddleNLP and the toolkit: about 4 s on a CPU core) overlap the stage it waits for.

    python scripts/stage_launcher.py SCRIPT READY_FILE   # then one JSON line on stdin

Runs SCRIPT's top level under the module name `__prestart__` (its imports; the `if __name__ ==
"__main__"` block does not run), creates READY_FILE, and waits for one line on stdin:
`{"argv": [...]}` runs SCRIPT as `python SCRIPT argv...` would (`sys.argv`, `sys.path[0]` and
`__name__ == "__main__"`), and the process ends with the script's exit status. An empty stdin
(whoever started it is gone) ends the process with status 1 without running the script.
`scripts/stage_scheduler.py` starts the quickstart's stages this way.
"""
import json
import os
import runpy
import sys

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
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
