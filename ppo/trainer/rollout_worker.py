"""The loop of a split run's rollout rank (`rollout_placement split`): generate, send, take new weights.

The rollout rank loads the actor only. It learns from the trainer where the run starts (step,
draw count, sampler position) and gets the weights of that step; then for each batch b from
there to the run's last step it receives the weights of version b - staleness when they are
newer than its own (`ppo.trainer.remote_rollout` gives the schedule both ranks follow),
generates batch b with the same `Rollout` a colocated run uses (same prompts, same seeded
draws), adds the reference log-probs when the run needs them (`reference_pass`: the same
`PlainPasses` pass the colocated trainer runs, so the numbers are the same; the trainer then
skips its own, which moves that frozen model's work off the training critical path) and sends it with the version and checksum of the weights that sampled it, its
sampler position and draw count afterwards, and the seconds it waited for the weights."""
import contextlib
import logging
import time

from .remote_rollout import experience_message

logger = logging.getLogger("ppo")


class GenerationInPlace:
    """The `passes` of a rollout rank's `Rollout`: its model generates as it is."""

    @contextlib.contextmanager
    def generation_weights(self):
        yield


class RolloutWorkerState:
    """What a rollout rank's `Rollout` reads of the run: the weights version (`step`) and the draws so far."""

    def __init__(self):
        self.step, self.gen_batches = 0, 0


class RolloutWorker:
    """`link`: the `RolloutLink`; `rollout`: a `Rollout` over this rank's actor whose `state`
    is a `RolloutWorkerState`; `params`: the actor's parameters in the trainer's order;
    `staleness`: `async_staleness`; `reference_pass`: `exp -> ref_logprobs [N, Tr]` (no
    gradient), or None when the run has no KL to a reference."""

    def __init__(self, link, rollout, params, staleness, reference_pass=None):
        self.link, self.rollout, self.params, self.staleness = link, rollout, params, staleness
        self.reference_pass = reference_pass
        self.state = rollout.state

    def train(self):
        """Serve the run's batches; returns a summary of what was generated."""
        hello = self.link.recv_object(self.link.trainer_rank, "waiting for the trainer to start")
        start, max_steps = hello["start"], hello["max_steps"]
        if start >= max_steps:
            return {"batches": 0}
        self.state.gen_batches = hello["gen_batches"]
        self.rollout.sampler.set_state_dict(hello["sampler"])
        version, checksum = self.link.receive_weights(self.params)
        waited_total = 0.0
        for index in range(start, max_steps):
            waited = 0.0
            if index - self.staleness > version:
                t0 = time.time()
                version, checksum = self.link.receive_weights(self.params)
                waited = time.time() - t0
            self.state.step = version  # the Rollout stamps the experience with it
            exp = self.rollout.generate()
            if self.reference_pass is not None:
                exp.ref_logprobs = self.reference_pass(exp)
            message = {"index": index, "version": version, "checksum": checksum, "train_wait_s": waited,
                       "gen_batches": self.state.gen_batches, "sampler": self.rollout.sampler.state_dict(),
                       "experience": experience_message(exp)}
            self.link.send_object(message, self.link.trainer_rank)
            waited_total += waited
        logger.info(f"rollout rank: generated batches {start}..{max_steps - 1}, {waited_total:.1f} s waiting for weights")
        return {"batches": max_steps - start, "train_wait_s": waited_total}

    def closing_text(self, summary):
        return f"rollout rank done: {summary}"
