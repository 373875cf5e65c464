"""How the run guard counts signals (`ppo.common.run_guard.StopRequest`): SIGTERMs within
REPEAT_WINDOW_S of the first signal are one request (a launcher's repeats: Paddle's sends up to
three 0.2 s apart, three more 3 s later); a SIGTERM after the window or a second SIGINT (Ctrl-C
again) stops at once. The launch through `paddle.distributed.launch` is in
tests/test_async_launch.py."""
import os
import signal
import time

import pytest

from ppo.common.run_guard import REPEAT_WINDOW_S, StopRequest, stop_requests


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_launchers_sigterms_are_one_request():
    clock = Clock()
    request = StopRequest(clock)
    for t in (0.0, 0.2, 0.4, 3.4, 3.6, 3.8):  # paddle.distributed.launch: terminate(), join(3 s), terminate(force)
        clock.now = 100.0 + t
        request.handle(signal.SIGTERM, None)
    assert request.signum == signal.SIGTERM and request.repeats == 5 and request.should_stop()
    clock.now = 100.0 + REPEAT_WINDOW_S + 0.1
    with pytest.raises(KeyboardInterrupt):  # a SIGTERM long after the first: stop now
        request.handle(signal.SIGTERM, None)


def test_a_second_ctrl_c_stops_at_once_and_a_sigterm_after_ctrl_c_repeats_it():
    clock = Clock()
    request = StopRequest(clock)
    request.handle(signal.SIGINT, None)
    clock.now += 0.1
    request.handle(signal.SIGTERM, None)  # the launcher's SIGTERM after the terminal's SIGINT
    assert request.signum == signal.SIGINT and request.repeats == 1
    with pytest.raises(KeyboardInterrupt):
        request.handle(signal.SIGINT, None)
    after_sigterm = StopRequest(clock)
    after_sigterm.handle(signal.SIGTERM, None)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C means "now" even right after a SIGTERM
        after_sigterm.handle(signal.SIGINT, None)


def test_three_real_sigterms_200ms_apart_leave_one_request():
    before = signal.getsignal(signal.SIGTERM)
    with stop_requests() as request:
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs in the main thread between bytecodes
    assert request.signum == signal.SIGTERM and request.repeats == 2 and request.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
