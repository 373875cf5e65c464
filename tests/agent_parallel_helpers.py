"""An environment for the multi-process agent tests (tests/test_agent_tensor_parallel.py),
importable as `tests.agent_parallel_helpers:CountingEchoEnv` by every launched rank."""
import os

from tests.agent_helpers import EchoEnv


class CountingEchoEnv(EchoEnv):
    """EchoEnv that appends one line `<pid> reset` / `<pid> step` to the file `log` for each call
    (which processes ran the environment, and how often)."""

    def __init__(self, log, turns=3, answer="ans"):
        super().__init__(turns, answer)
        self.log = log

    def _note(self, what):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {what}\n")

    def reset(self, record):
        self._note("reset")
        return super().reset(record)

    def step(self, action_text):
        self._note("step")
        return super().step(action_text)
