"""Stopping a run on SIGTERM / SIGINT without losing its work.

A scheduler's SIGTERM (or Ctrl-C) would otherwise end a run at once, losing everything since
the last checkpoint. While a run trains, `stop_requests()` turns the first SIGTERM or SIGINT
into a request that the training loop honours at its next step boundary: it saves a checkpoint
and stops with `RunInterrupted`, whose message says where it saved and how to resume; the
process then exits with 128 + the signal number (143 for SIGTERM, 130 for SIGINT), as a shell
reports a process killed by that signal.

Repeated SIGTERMs within `REPEAT_WINDOW_S` (5 s) of the first signal count as one: launchers
send several (`paddle.distributed.launch` sends SIGTERM to a worker up to three times 0.2 s
apart, then, 3 s later, three more and SIGKILL). A later SIGTERM, or a second SIGINT at any
time (a person pressing Ctrl-C again), stops at once without saving (KeyboardInterrupt).
In a multi-process run every rank stops at the same step (the request is all-reduced).
"""
import contextlib
import logging
import signal
import threading
import time

logger = logging.getLogger("ppo")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_WINDOW_S = 5.0  # SIGTERMs this soon after the first signal repeat it


class RunInterrupted(RuntimeError):
    """The run stopped on a signal after saving; `exit_code` is 128 + the signal number."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class RolloutRankLost(RuntimeError):
    """A split run's rollout rank stopped answering (it died, or its link broke): the trainer
    saves the last completed step and stops (`ppo.trainer.loop.OnlineLoop.save_before_stopping`)."""


class StopRequest:
    """Records the first SIGTERM / SIGINT received while installed; `repeats` counts the
    SIGTERMs taken as repeats of it (`REPEAT_WINDOW_S`). `clock`: seconds, monotonic."""

    def __init__(self, clock=time.monotonic):
        self.signum, self.first_at, self.repeats, self.clock = None, None, 0, clock

    @property
    def signal_name(self):
        return signal.Signals(self.signum).name if self.signum else None

    def is_repeat(self, signum):
        """Whether `signum`, arriving after the first signal, repeats it (a launcher's SIGTERMs)
        rather than asking to stop at once (a second Ctrl-C, or a SIGTERM after the window)."""
        return signum == signal.SIGTERM and self.clock() - self.first_at < REPEAT_WINDOW_S

    def handle(self, signum, frame):
        if self.signum is not None:
            if self.is_repeat(signum):
                self.repeats += 1
                return
            logger.warning(f"{signal.Signals(signum).name} again: stopping at once, without saving")
            raise KeyboardInterrupt
        self.signum, self.first_at = signum, self.clock()
        logger.warning(f"{signal.Signals(signum).name} received: the run saves a checkpoint at the end of this step "
                       f"and stops (Ctrl-C again, or SIGTERM after {REPEAT_WINDOW_S:.0f} s, stops at once)")

    def should_stop(self, world_size=1):
        """Whether a stop was requested here or, in a multi-process run, on any rank (collective
        then: every rank calls it at the same point); the signal number is kept."""
        if world_size <= 1:
            return self.signum is not None
        import paddle
        import paddle.distributed as dist

        from .training_world import training_group

        flag = paddle.to_tensor([self.signum or 0], dtype="int64")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=training_group())
        if int(flag.numpy()[0]) and self.signum is None:  # another rank's signal: this one's come as repeats
            self.signum, self.first_at = int(flag.numpy()[0]), self.clock()
        return self.signum is not None


@contextlib.contextmanager
def stop_requests():
    """Install the SIGTERM / SIGINT handlers of a `StopRequest` for the block (main thread only;
    elsewhere the request simply never fires) and restore the previous handlers after it."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.signal(s, request.handle) for s in HANDLED_SIGNALS}
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def interrupted_message(request, step, saved_path):
    """What `RunInterrupted` says: the signal, the step, where it saved and how to resume."""
    return (f"stopped by {request.signal_name} after step {step}: saved {saved_path}; run the same command again "
            "(with overwrite_output_dir false) to resume from it")


class FlatRewardWatch:
    """Warn once when every group's rewards were all equal (`grpo/frac_reward_zero_std` 1.0)
    for `patience` steps in a row: group-relative advantages are then zero everywhere and the
    policy does not learn (a scorer that answers a constant, or a task too easy or too hard)."""

    def __init__(self, patience=3):
        self.patience = patience
        self.run_length = 0
        self.warned = False

    def check(self, step, metrics):
        """The warning for `metrics` of `step` (once per run; None otherwise)."""
        flat = metrics.get("grpo/frac_reward_zero_std")
        self.run_length = self.run_length + 1 if flat is not None and float(flat) >= 1.0 else 0
        if self.warned or self.run_length < self.patience:
            return None
        self.warned = True
        message = (f"steps {step - self.patience + 1}-{step}: every reward in every group was equal, so every GRPO "
                   "advantage is zero and the policy learns nothing from these steps; check the scorer (a constant "
                   "reward?), or make the groups differ (more rollout_n, a higher temperature, harder or easier prompts)")
        logger.warning(message)
        return message
