"""Step 1 of a split run's trainer (`rollout_placement split`): the rollout comes from another rank.

`RemoteRollout` stands where `Rollout` stands in the `ExperienceMaker`: `generate()` returns
this trainer rank's batch of this step, generated on the rollout rank the run's layout deals it
to (`RolloutLayout.replica_of`, `ppo.trainer.rollout_worker`) with the weights of step
`step - staleness` or newer, and before that hands the rollout ranks the weights they will need
next (trainer rank 0 sends them; the others only note their checksum). Every rank follows one
schedule, so the blocking exchanges always pair up: with staleness s, at step k the trainer
  1. receives the batches numbered below k + s (the rollout rank generated them meanwhile),
  2. sends the weights of version k when a batch still to come needs them (k > start, k + s < max_steps),
  3. receives batch k if it has not yet,
and each rollout rank, for each batch b, first receives version b - s when it is newer than
what it holds. s = 0 is the synchronous run (the weights of step k sample batch k, as the
colocated run); s = 1 generates batch k + 1 while step k trains. Batch b is the b-th draw
of the colocated run: the same prompts (`PromptSampler` position) and sampling seed
(`gen_batches`), so the prompt order never depends on the placement, and a resumed run asks
for batch `step` again (regenerated from the checkpoint's weights). The trainer keeps the
rollout rank's sampler position and draw count of the batch it trains on, so its checkpoints
resume where an uninterrupted run would.

Metrics: `async/staleness_mean` (training steps between the weights that sampled the batch and
this step), `async/rollout_wait_s` (time the trainer waited for batches),
`async/train_wait_s` (time the rollout rank waited for weights before generating it),
`async/weights_sync_s` (sending the weights).

Partial rollouts (`partial_rollout`, s >= 1): at step k the trainer sends version k FIRST (when
k > start and batch k + s - 1 exists), then receives the batches below k + s: the rollout rank
takes version k in the middle of batch k + s - 1 (`RolloutWorker.at_boundary`). A batch then
carries per-token versions (`Experience.token_versions`) and the checksum of each version it
used; the staleness metrics are per token (`async/staleness_mean` over tokens,
`async/staleness_max` the oldest token's, at most s, `async/fresh_token_frac`)."""
import time

import paddle

from ..algos.token_versions import token_staleness_metrics
from ..common.rank_faults import agree, lost_together
from ..experience.stages import ROW_LISTS, ROW_TENSORS, Experience


def experience_message(exp):
    """A rollout-stage `Experience` as picklable numpy arrays and lists."""
    tensors = {name: getattr(exp, name).numpy() for name in ROW_TENSORS if getattr(exp, name) is not None}
    lists = {name: getattr(exp, name) for name in ROW_LISTS if getattr(exp, name) is not None}
    return {"prompt_len": exp.prompt_len, "version": exp.version, "tensors": tensors, "lists": lists}


def experience_from_message(message):
    """The `Experience` of `experience_message(exp)`, bit for bit."""
    fields = {name: paddle.to_tensor(value) for name, value in message["tensors"].items()}
    return Experience(prompt_len=message["prompt_len"], version=message["version"], **fields, **message["lists"])


class RemoteRollout:
    """`link`: the run's `RolloutLink`; `params`: the trainer's actor parameters (a callable
    giving them in order); `sampler`: the run's `PromptSampler` (its position follows the
    batches trained on); `state`: the `RunState`; `staleness`: `async_staleness`; `max_steps`:
    the run's steps; `partial`: `partial_rollout` (the weights go out before the batches come in)."""

    def __init__(self, link, params, sampler, state, *, staleness, max_steps, partial=False):
        self.link, self.params, self.sampler, self.state = link, params, sampler, state
        self.staleness, self.max_steps, self.partial = staleness, max_steps, bool(partial)
        self.start, self.received, self.metrics = None, {}, {}
        self.sent = {}  # version -> checksum of the weights sent as that version

    def hello(self):
        """Tell the rollout ranks that serve this trainer rank where the run starts (its step, draw
        count and sampler position: the checkpoint's on a resume) and send them the current weights."""
        self.start, layout, rank = self.state.step, self.link.layout, self.link.rank
        message = {"start": self.start, "max_steps": self.max_steps, "gen_batches": self.state.gen_batches,
                   "sampler": self.sampler.state_dict()}
        if rank == layout.data_rank_trainers(layout.data_rank(rank))[0]:  # one hello per data rank
            for replica in layout.replica_ranks:
                if rank in layout.served_trainers(replica):
                    self.link.send_object(message, replica, "starting the rollout rank")
        if self.start < self.max_steps:
            self.sent[self.start] = self.link.send_weights(self.params(), self.start)

    def receive_below(self, end):
        """Receive the batches numbered below `end` (at most `max_steps`) not yet received;
        returns the seconds it waited."""
        t0 = time.time()
        while self.state.step + len(self.received) < min(end, self.max_steps):  # batches below `step` are trained on
            index = self.state.step + len(self.received)
            layout = self.link.layout
            message = self.link.recv_object(layout.replica_of(index, layout.data_rank(self.link.rank)))
            self.received[message["index"]] = message
        return time.time() - t0

    def before_batch(self):
        """Steps 1 and 2 of this step's schedule (done once: a second call finds them done);
        returns `(seconds waiting for batches, seconds sending weights)`."""
        if self.start is None:
            self.hello()
        k, s = self.state.step, self.staleness
        # 2. the weights a later batch needs: before the batches with partial rollouts (taken in
        # the middle of batch k + s - 1), else after them (taken before batch k + s)
        sync = self.send_version(k, k + s - 1) if self.partial else 0.0
        waited = self.receive_below(k + s)  # 1. what the rollout rank generated meanwhile
        if not self.partial:
            sync = self.send_version(k, k + s)
        return waited, sync

    def send_version(self, k, first_batch):
        """Send the weights of version `k` once when a batch from `first_batch` on still needs them;
        returns the seconds it took."""
        if not (k > self.start and first_batch < self.max_steps and k not in self.sent):
            return 0.0
        t0 = time.time()
        self.sent[k] = self.link.send_weights(self.params(), k)
        return time.time() - t0

    def check_peer(self):
        """After a stop request was saved (every trainer rank at that point): raises
        `RolloutRankLost` naming the ranks that are gone (`ppo.common.rank_faults`: the launcher
        sends its SIGTERMs when a rank died); live rollout ranks are left waiting at a point of
        the schedule (they stop when the trainer ranks exit)."""
        verdict = agree(self.link.layout, None, probe=True)
        if verdict is not None:
            raise verdict

    def generate(self):
        """This step's batch: an `Experience` at stage "rollout" with the rollout's own log-probs
        and the version of the weights that sampled it (`Experience.version`)."""
        with lost_together(self.link.layout):  # the weights went out to every rollout rank, or all stop here
            waited, sync = self.before_batch()  # (a cut-short broadcast leaves rollout ranks waiting in it)
        k = self.state.step
        with lost_together(self.link.layout):  # every trainer rank has its batch, or all stop here
            waited += self.receive_below(k + 1)  # 3. this step's batch
        message = self.received.pop(k)
        self.state.gen_batches = message["gen_batches"]  # as after the colocated run's draw of this batch
        self.sampler.set_state_dict(message["sampler"])
        version, checksum = message["version"], message["checksum"]
        for v, c in message.get("versions", {version: checksum}).items():
            if c != self.sent[v]:  # the rollout rank checks each set it applies: never expected
                raise RuntimeError(f"batch {k} was generated from weights of version {v} with checksum {c!r}, "
                                   f"not the {self.sent[v]!r} sent")
        self.sent = {v: c for v, c in self.sent.items() if v >= version}  # later batches need no older version
        exp = experience_from_message(message["experience"])
        self.metrics = {"async/staleness_mean": float(k - version), "async/rollout_wait_s": waited,
                        "async/train_wait_s": message["train_wait_s"], "async/weights_sync_s": sync,
                        "async/weights_version": float(version), "async/weights_checksum": checksum}
        if exp.token_versions is not None:
            self.metrics.update(self.token_metrics(exp, k))
        return exp

    def token_metrics(self, exp, k):
        """The per-token staleness of a partial rollout's batch trained at step `k`; raises when
        its oldest token is more than `async_staleness` behind (the schedule never lets it)."""
        metrics = {name: float(value) for name, value in token_staleness_metrics(exp.token_versions, exp.response_mask,
                                                                                k).items()}
        if metrics["async/staleness_max"] > self.staleness:
            raise RuntimeError(f"batch {k} has tokens {metrics['async/staleness_max']:.0f} steps stale, over "
                               f"async_staleness {self.staleness}")
        return metrics

    def close(self):
        """At the end of the run: a rollout rank never started (a finished run resumed) is told
        there is nothing to generate."""
        if self.start is None:
            self.hello()
