"""How an entry point's process ends after a multi-process run."""
import atexit
import logging
import os
import sys

from .run_guard import RunInterrupted


def run_and_exit(main):
    """Run an entry point's `main()`. In a multi-process run every rank then waits for the
    others (a barrier) and leaves after the interpreter's exit handlers (files, loggers) but
    without the C++ teardown of Paddle's gloo groups and stores: their destruction order across
    processes can abort a rank after the run has finished and written everything (SIGABRT: exit
    status 250 from `paddle.distributed.launch`, no traceback). An exception in `main` propagates
    as usual; RunInterrupted (a run that saved on SIGTERM / SIGINT) prints its message and exits
    with its code (128 + the signal number)."""
    try:
        main()
    except RunInterrupted as stop:  # saved on SIGTERM / SIGINT: one line, no traceback
        atexit._run_exitfuncs()  # the output_dir lock, open files
        logging.shutdown()
        print(f"error: {stop}", file=sys.stderr, flush=True)
        os._exit(stop.exit_code)
    import paddle.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
