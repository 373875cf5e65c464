"""`paddle-align`: every entry point as one installed command (`pip install -e .`).

    paddle-align ppo config/tiny/ppo_argument.json        # python ppo/run_ppo.py config/tiny/ppo_argument.json
    paddle-align grpo config/tiny/grpo_argument.json      # the same script (GRPO is an adv_estimator)
    paddle-align sft config/tiny/sft_argument.json --max_steps 10
    paddle-align reward-server --port 8731 --scorer reverse
    paddle-align --help                                   # the commands

Each command runs its script from the repository checkout exactly as `python <script> ...`
does (same arguments, output and exit status); `ppo/common/entry_points.py` lists them. A
relative argument-file path not found from the working directory resolves against the
repository root, as it does for the scripts.
"""
import os
import runpy
import sys

from .common.argument_files import REPO_ROOT
from .common.entry_points import ENTRY_POINTS, entry_point

PROGRAM = "paddle-align"


def commands_text():
    """`paddle-align --help`: the usage and one line per command."""
    width = max(len(e.command + "".join(f", {a}" for a in e.aliases)) for e in ENTRY_POINTS)
    lines = [f"usage: {PROGRAM} COMMAND [ARGUMENT_FILE.json|.yaml] [--name value ...]", "",
             "LLM alignment on PaddlePaddle. Commands (each runs its script; COMMAND --help lists its arguments):", ""]
    for e in ENTRY_POINTS:
        names = e.command + "".join(f", {a}" for a in e.aliases)
        lines.append(f"  {names:<{width}}  {e.summary} ({e.script})")
    return "\n".join(lines) + "\n"


def script_path(entry):
    """The entry point's script in the checkout; SystemExit(2) saying how to install when absent."""
    path = os.path.join(REPO_ROOT, entry.script)
    if not os.path.isfile(path):
        sys.stderr.write(f"{PROGRAM} {entry.command}: {entry.script} is not at {REPO_ROOT}: the commands run the scripts "
                         "of a repository checkout; install it with pip install -e . from the checkout\n")
        raise SystemExit(2)
    return path


def main(argv=None):
    """Run `paddle-align COMMAND ...`: the command's script as `__main__` with the remaining words
    as its arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(commands_text())
        return 0 if argv else 2
    entry = entry_point(argv[0])
    if entry is None:
        sys.stderr.write(f"{PROGRAM}: error: unknown command {argv[0]!r}; the commands are "
                         f"{', '.join(e.command for e in ENTRY_POINTS)} ({PROGRAM} --help)\n")
        return 2
    path = script_path(entry)
    sys.argv = [path, *argv[1:]]
    runpy.run_path(path, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
