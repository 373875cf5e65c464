"""How an entry point's process ends: argument and data errors as one message, exit code 2;
after a multi-process run, without the C++ teardown that can abort a finished rank."""
import atexit
import logging
import os
import sys

from .argument_problems import UsageError
from .run_guard import RunInterrupted

USAGE_ERROR_EXIT_CODE = 2  # argparse's and the shell's "wrong usage" status
STOPPED_EXIT_CODE = 1


class RunStopped(RuntimeError):
    """A run that stopped itself for a reason its message names in full (e.g. tools that keep
    failing): printed as one message without a traceback, exit status 1."""


def usage_error_types():
    """The errors that mean "the arguments or the data are wrong" (no traceback helps there)."""
    return (UsageError,)


def exit_on_usage_error(error):
    """Print `error` as one message on stderr (no traceback) and exit with status 2."""
    program = os.path.basename(sys.argv[0] or "run")
    sys.stdout.flush()
    sys.stderr.write(f"{program}: error: {error}\n")
    sys.stderr.flush()
    raise SystemExit(USAGE_ERROR_EXIT_CODE)


def run_and_exit(main):
    """Run an entry point's `main()`. An argument or data error (`usage_error_types`) ends the
    process with its message on stderr and exit status 2, without a traceback; any other
    exception propagates with its traceback. RunInterrupted (a run that saved on SIGTERM /
    SIGINT) prints its message and exits with its code (128 + the signal number); RunStopped
    prints its message and exits with status 1.

    In a multi-process run every rank then waits for the others (a barrier) and leaves after the
    interpreter's exit handlers (files, loggers) but without the C++ teardown of Paddle's gloo
    groups and stores: their destruction order across processes can abort a rank after the run
    has finished and written everything (SIGABRT: exit status 250 from
    `paddle.distributed.launch`, no traceback)."""
    try:
        main()
    except RunInterrupted as stop:  # saved on SIGTERM / SIGINT: one line, no traceback
        atexit._run_exitfuncs()  # the output_dir lock, open files
        logging.shutdown()
        print(f"error: {stop}", file=sys.stderr, flush=True)
        os._exit(stop.exit_code)
    except RunStopped as stop:  # stopped itself, its reason in the message: one line, no traceback
        program = os.path.basename(sys.argv[0] or "run")
        sys.stdout.flush()
        print(f"{program}: error: {stop}", file=sys.stderr, flush=True)
        raise SystemExit(STOPPED_EXIT_CODE)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a usage error
        if isinstance(error, usage_error_types()):
            exit_on_usage_error(error)
        raise
    import paddle.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
