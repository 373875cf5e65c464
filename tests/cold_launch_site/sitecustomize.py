"""Installs the CPU stand-ins of the model-parallel collectives (`tests/tp_cpu_collectives.py`) in
every worker of a cold `paddle.distributed.launch` run, before the launched script runs.

`tests/tp_launch.cold_launch` puts this folder first on PYTHONPATH only for tensor-parallel runs;
Python's `site` module imports `sitecustomize` while the interpreter starts. A process started by
the launcher as a worker (it has `PADDLE_TRAINER_ID`) imports Paddle here and installs the
stand-ins; any other process (the launcher itself) is left alone. Without them, a tensor-parallel
worker on CPU stops at the first model-parallel all-reduce: "ProcessGroupGLOO does not support
all_reduce with sync_op and use_calc_stream flag" (then `c_identity` has no CPU kernel).
This file shadows any other `sitecustomize` on the interpreter's path while the folder is first.
"""
import os
import sys

if "PADDLE_TRAINER_ID" in os.environ:
    os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")  # before Paddle loads, as the entry scripts do
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    try:
        import tp_cpu_collectives
    finally:
        sys.path.pop(0)
    tp_cpu_collectives.install()
