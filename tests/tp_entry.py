"""Run an entry script with the CPU stand-ins of the model-parallel collectives installed.

    python -m paddle.distributed.launch --nproc_per_node 2 tests/tp_entry.py ppo/run_ppo.py ARGS...

Test-only: `tests/tp_cpu_collectives.py` replaces the GPU collectives that fleet's
tensor-parallel layers call (no CPU kernels) with gloo-based equivalents, then the
script runs as `__main__` with the remaining arguments.

With WARM_LAUNCH_SOCK set (tests/tp_launch.py sets it), this process imports nothing heavy:
it hands the same command to tests/warm_python.py's zygote, whose child has Paddle and the
entry modules imported already, and exits as that child exits (`tests/warm_client.py`).
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

import warm_client  # noqa: E402  (no Paddle)

if __name__ == "__main__" and warm_client.launch_worker_servable(os.environ):
    warm_client.run_as_launch_worker([os.path.abspath(__file__), *sys.argv[1:]])
os.environ.pop(warm_client.SOCKET_ENV, None)  # the script's own children start cold

import tp_cpu_collectives  # noqa: E402


def refresh_import_time_ranks():
    """Forget what was read from the launcher's variables while importing (a zygote child imported
    these before the launcher gave it a rank): Paddle's cached parallel environment and backup
    environment file, PaddleNLP's module-level world size and its pretraining datasets' rank.
    Found by recording every PADDLE_* read and rank query made while importing the entry modules."""
    parallel = sys.modules.get("paddle.distributed.parallel")
    if parallel is not None:
        parallel._global_parallel_env = None
    if "paddle.distributed.backup_env" in sys.modules:
        sys.modules["paddle.distributed.backup_env"].g_backup_envs = None
    if "paddlenlp.utils.distributed" in sys.modules:
        import paddle.distributed

        sys.modules["paddlenlp.utils.distributed"].world_size = paddle.distributed.get_world_size()
    for name in ("paddlenlp.data.causal_dataset", "paddlenlp.data.blendable_dataset"):
        if name in sys.modules:
            sys.modules[name].local_rank = int(os.getenv("PADDLE_RANK_IN_NODE", 0))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: tp_entry.py SCRIPT [ARGS...]")
    refresh_import_time_ranks()
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
