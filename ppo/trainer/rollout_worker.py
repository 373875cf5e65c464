"""The loop of a split run's rollout rank (`rollout_placement split`): generate, send, take new weights.

The rollout rank loads the actor only. It learns from each trainer rank it serves where the run
starts (step, draw count, sampler position) and gets the weights of that step; then for each
batch b from there to the run's last step it receives the weights of version b - staleness
when they are newer than its own (`ppo.trainer.remote_rollout` gives the schedule every rank
follows), and walks batch b's units in the layout's fixed order (`RolloutLayout.units`):
trainer rank t's unit dealt to this rank it generates with the same `Rollout` colocated data
rank t uses (same prompts, same seeded draws, one `Rollout` per trainer rank served), one dealt
to another rollout rank only advances that `Rollout`'s prompt sampler and draw count. It adds
the reference log-probs when the run needs them (`reference_pass`: the same `PlainPasses` pass
the colocated trainer runs, so the numbers are the same; the trainer then skips its own, which
moves that frozen model's work off the training critical path) and sends
it to trainer rank t with the version and checksum of the weights that sampled it, its sampler
position and draw count afterwards, and the seconds it waited for the weights.

With `partial_rollout` (staleness s >= 1) batch b starts under version b - s and, after every
response's first `partial_rollout_tokens` tokens, takes version b - s + 1, which the trainer
sends as soon as its step b - s + 1 begins (`RemoteRollout`); unfinished responses continue
under it (re-prefilled, `ppo.rollout.partial`), so a response spans the update and its tokens
carry two versions, the oldest at most s steps behind the step that trains on them.
The update lands at that chunk boundary every run (the rank waits for it there), so the
batches are the same whatever the timing, unlike slime's and AReaL's interrupt-when-ready.
A rank holding several units of a step generates them together (`generate_units`: every unit's
first chunk, the update once, then the rest of every unit), and a rank with none takes the update
as well, so the batches are the same whichever rank generates them (docs/split_rollout.md)."""
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
    """`link`: the `RolloutLink`; `rollouts`: `Rollout`s over this rank's actor whose `state`
    is a `RolloutWorkerState`, as `{data rank: such a Rollout}` for every trainer data rank this
    rank's replica serves (a data rank is one trainer rank, or one tensor-parallel group of them;
    every rank of a replica generates each batch, its leader sends it to each trainer rank of the
    data rank); `params`: the actor's parameters in the trainer's order;
    `staleness`: `async_staleness`; `reference_pass`: `exp -> ref_logprobs [N, Tr]` (no
    gradient), or None when the run has no KL to a reference; `partial_tokens`: `partial_rollout_tokens`
    of a `partial_rollout` run (0: off), the tokens every response generates before the update of
    its step is taken (then the rollout's `partial` is this worker: `chunk_tokens`, `at_boundary`:
    two chunks, so a response is re-prefilled once, at the update)."""

    def __init__(self, link, rollouts, params, staleness, reference_pass=None, partial_tokens=0):
        self.rollouts = dict(rollouts)
        self.link, self.params, self.staleness = link, params, staleness
        self.reference_pass, self.partial_tokens = reference_pass, int(partial_tokens)
        self.used, self.pending, self.waited = {}, False, 0.0
        if self.partial_tokens:
            for each in self.rollouts.values():
                each.partial = self

    def train(self):
        """Serve the run's batches; returns a summary of what was generated."""
        layout, rank = self.link.layout, self.link.rank
        hellos = {d: self.link.recv_object(layout.data_rank_trainers(d)[0], "waiting for the trainer to start")
                  for d in self.rollouts}
        starts = {layout.data_rank_trainers(d)[0]: (hello["start"], hello["max_steps"]) for d, hello in hellos.items()}
        if len(set(starts.values())) > 1:  # the trainer ranks resumed from different checkpoints: never expected
            raise RuntimeError(f"the trainer ranks start at different (step, max_steps): {starts}")
        start, max_steps = starts[min(starts)]
        if start >= max_steps:
            return {"batches": 0}
        for t, hello in hellos.items():
            self.rollouts[t].state.gen_batches = hello["gen_batches"]
            self.rollouts[t].sampler.set_state_dict(hello["sampler"])
        self.version, self.checksum = self.link.receive_weights(self.params)
        waited_total, generated = 0.0, 0
        for index in range(start, max_steps):
            self.waited = 0.0
            if index - self.staleness > self.version:
                self.take_weights()
            mine = []
            for d, leader in layout.units(index):
                if d not in self.rollouts:
                    continue
                if leader != layout.leader(rank):  # another replica generates it
                    self.rollouts[d].skip()
                else:
                    mine.append(d)
            for d, message in self.generate_units(index, {d: self.rollouts[d] for d in mine}):
                for t in layout.data_rank_trainers(d) if rank == layout.leader(rank) else ():
                    self.link.send_object(message, t)
                waited_total, generated = waited_total + message["train_wait_s"], generated + 1
        logger.info(f"rollout rank: generated {generated} batches of steps {start}..{max_steps - 1}, "
                    f"{waited_total:.1f} s waiting for weights")
        return {"batches": generated, "train_wait_s": waited_total}

    def generate_units(self, index, rollouts):
        """Batch `index` of each of `rollouts` (`{data rank: Rollout}`, this replica's units of the
        step in the deal's order), yielded as `(data rank, the message that carries it)`, each as
        soon as it is ready. With a partial rollout they are generated together, chunk by chunk:
        every unit's first chunk under the version held, then the update, then the rest of every
        unit, so each unit spans the update whichever replica generates it and however many units
        it holds (the batches of one trainer rank beside one rollout rank); a rank with no unit in
        the step takes the update too (the broadcast reaches every rollout rank)."""
        self.used = {self.version: self.checksum}
        self.pending = self.partial_tokens > 0 and index - self.staleness + 1 > self.version
        for rollout in rollouts.values():
            rollout.state.step = self.version  # the Rollout stamps the experience with it (the oldest token's)
        if self.partial_tokens:
            exps = self.generate_together([rollout.generate_chunks() for rollout in rollouts.values()])
            if self.pending:  # no unit here, or every response ended first: each rollout rank takes each version
                self.take_weights()
        else:
            exps = (rollout.generate() for rollout in rollouts.values())
        for (d, rollout), exp in zip(rollouts.items(), exps):
            if self.reference_pass is not None and self.link.rank == self.link.layout.leader(self.link.rank):
                exp.ref_logprobs = self.reference_pass(exp)
            yield d, {"index": index, "version": exp.version, "checksum": self.used[exp.version],
                      "versions": dict(self.used), "train_wait_s": self.waited, "gen_batches": rollout.state.gen_batches,
                      "sampler": rollout.sampler.state_dict(), "experience": experience_message(exp)}
            self.waited = 0.0  # the wait goes with the first message

    def generate_together(self, generations):
        """Run `Rollout.generate_chunks` generators chunk by chunk, all of them at each boundary
        (`at_boundary` once per boundary); returns their experiences in order."""
        results, boundaries = [None] * len(generations), {}
        for i, g in enumerate(generations):  # each draws its prompts and stops before chunk 0
            boundaries[i] = next(g)
        while boundaries:
            version = self.at_boundary(min(boundaries.values()))
            for i in sorted(boundaries):
                try:
                    boundaries[i] = generations[i].send(version)
                except StopIteration as done:
                    results[i] = done.value
                    del boundaries[i]
        return results

    def take_weights(self):
        """Receive the next weights version (blocking until the trainer sends it)."""
        t0 = time.time()
        self.version, self.checksum = self.link.receive_weights(self.params)
        self.used[self.version] = self.checksum
        self.pending, self.waited = False, self.waited + time.time() - t0

    def chunk_tokens(self, chunk):
        """A partial rollout's chunk sizes: `partial_rollout_tokens`, then the rest of the response."""
        return self.partial_tokens if chunk == 0 else 1 << 30

    def at_boundary(self, chunk):
        """A partial rollout's chunk boundary: before chunk 1 of a batch whose update is due, take
        the new weights; the tokens so far keep their version. Returns the version now held."""
        if self.pending and chunk >= 1:
            self.take_weights()
        return self.version

    def closing_text(self, summary):
        return f"rollout rank done: {summary}"
