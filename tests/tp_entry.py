"""Run an entry script with the CPU stand-ins of the model-parallel collectives installed.

    python -m paddle.distributed.launch --nproc_per_node 2 tests/tp_entry.py ppo/run_ppo.py ARGS...

Test-only: `tests/tp_cpu_collectives.py` replaces the GPU collectives that fleet's
tensor-parallel layers call (no CPU kernels) with gloo-based equivalents, then the
script runs as `__main__` with the remaining arguments.
"""
import atexit
import logging
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")

import tp_cpu_collectives  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: tp_entry.py SCRIPT [ARGS...]")
    tp_cpu_collectives.install()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    # Leave after the script's own exit handlers (files, loggers) without the C++ teardown of
    # the gloo groups and stores: their destruction order across processes can abort one rank
    # after the run has finished (SIGABRT, no traceback).
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
