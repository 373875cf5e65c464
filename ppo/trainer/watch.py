"""The run's divergence watch (`ppo.common.divergence.DivergenceDetector`): the update judges
every optimiser step's losses and gradient norms, the loop judges the step's KL; the first
message per metric of a step is kept, every message of the run goes to `summary.json`, and every
rank learns when any rank diverged."""
import logging

logger = logging.getLogger("ppo")

STEP_METRICS = ("objective/kl",)
"""The metrics judged once per step (the others once per optimiser step)."""


class DivergenceWatch:
    """`detector`: a `DivergenceDetector` (checkpointed as the run state's "divergence");
    `ranks`: the run's `Ranks`."""

    def __init__(self, detector, ranks):
        self.detector, self.ranks = detector, ranks
        self.pending = {}  # metric name -> first divergence message of the current step
        self.log = []  # every divergence message of the run

    def judge_update(self, step, judged):
        """Judge one optimiser step's metrics (`judged`: name -> float) at the 1-based `step`."""
        for name, message in self.detector.check(step, judged).items():
            self.pending.setdefault(name, message)

    def judge_step(self, step, metrics):
        """This step's divergence messages (the per-step metrics judged now), logged as warnings;
        every rank gets a non-empty list when any rank diverged (collective on several)."""
        self.pending.update(self.detector.check(step, {k: metrics[k] for k in STEP_METRICS if k in metrics}))
        messages, self.pending = list(self.pending.values()), {}
        self.log += messages
        for message in messages:
            logger.warning(f"the run is diverging: {message}")
        if self.ranks.world_size > 1 and self.ranks.any(bool(messages)) and not messages:
            messages = [f"step {step}: a metric diverged on another rank"]
        return messages

    def state_dict(self):
        return self.detector.state_dict()

    def set_state_dict(self, state):
        self.detector.set_state_dict(state)
