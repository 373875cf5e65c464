"""A discrete-event model of a split run's schedule (`rollout_placement split`).

N trainer ranks beside M rollout ranks at staleness s, each process a sequence of work and
blocking exchanges.

It follows the schedule `ppo.trainer.remote_rollout` and `ppo.trainer.rollout_worker` run
(non-partial rollouts):
- trainer rank t, step k: receive its batches numbered below k + s; trainer rank 0 then
  broadcasts weights version k when k > 0 and batch k + s exists; receive batch k; train
  (`train_s`), then the data-parallel all-reduce (all trainer ranks meet);
- rollout rank r: receive version 0; for each batch b, receive version b - s when it is newer
  than what it holds, then generate (`gen_s` each) the units of batch b dealt to it
  (`RolloutLayout.replica_of`: unit (b, t) to replica (b * N + t) mod M) and send them;
- a weights broadcast is a collective of trainer rank 0 and every rollout rank: it starts when
  all have arrived and costs each of them `sync_s`;
- a batch send does not block the sender (the message is small beside a generation).

Processes share `cores` cores (processor sharing: while k processes work beside `background`
other busy threads, each advances at min(1, cores / (k + background)) seconds of work per
second), which is what four single-thread processes on a two-core machine do; `cores=inf` is
one accelerator per process. Pure Python, no Paddle."""
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SplitRun:
    """`trainers` N, `replicas` M, `staleness` s, `steps`; `gen_s`: one replica generating one
    trainer rank's batch alone; `train_s`: one training step of a trainer rank alone (its own
    batch: data parallel); `sync_s`: one weights broadcast; `cores`: the cores they share;
    `background`: other busy threads on those cores (a shared host's load)."""

    trainers: int
    replicas: int
    staleness: int
    steps: int
    gen_s: float
    train_s: float
    sync_s: float
    cores: float = math.inf
    background: float = 0.0

    def replica_of(self, batch, trainer):
        """The replica index (0..M-1) that generates unit (batch, trainer)."""
        return (batch * self.trainers + trainer) % self.replicas


def trainer_program(run, t):
    """Trainer rank t's actions: ("recv", key), ("meet", name), ("work", seconds)."""
    received = 0
    if t == 0:
        yield ("meet", ("weights", 0))
    for k in range(run.steps):
        while received < min(k + run.staleness, run.steps):
            yield ("recv", (received, t))
            received += 1
        if t == 0 and k > 0 and k + run.staleness < run.steps:
            yield ("meet", ("weights", k))
        if received <= k:
            yield ("recv", (k, t))
            received = k + 1
        yield ("work", run.train_s)
        yield ("meet", ("allreduce", k))


def replica_program(run, r):
    """Rollout replica r's actions: ("meet", name), ("work", seconds), ("post", key)."""
    yield ("meet", ("weights", 0))
    version = 0
    for b in range(run.steps):
        if b - run.staleness > version:
            version = b - run.staleness
            yield ("meet", ("weights", version))
        for t in range(run.trainers):
            if run.replica_of(b, t) == r:
                yield ("work", run.gen_s)
                yield ("post", (b, t))


def _members(run, name):
    """The process names that meet at collective `name`."""
    if name[0] == "weights":
        return {("trainer", 0)} | {("replica", r) for r in range(run.replicas)}
    return {("trainer", t) for t in range(run.trainers)}


class _Simulation:
    """The event loop: each process runs until it works or blocks; time advances to the next
    work completion at the processor-sharing rate."""

    def __init__(self, run):
        self.run = run
        self.programs = {("trainer", t): trainer_program(run, t) for t in range(run.trainers)}
        self.programs.update({("replica", r): replica_program(run, r) for r in range(run.replicas)})
        self.now, self.posted, self.arrived = 0.0, set(), {}
        self.work, self.blocked = {}, {}  # process -> remaining seconds / the action it waits on
        self.waited = {name: 0.0 for name in self.programs}
        self.finished = {}

    def advance(self, name, action=None):
        """Run process `name` from `action` (or its next one) until it works, blocks or ends."""
        while True:
            if action is None:
                action = next(self.programs[name], None)
            if action is None:
                self.finished[name] = self.now
                return
            kind, arg = action
            if kind == "post":
                self.posted.add(arg)
            elif kind == "work":
                self.work[name] = arg
                return
            elif kind == "recv" and arg not in self.posted or kind == "meet" and not self.meet(name, arg):
                self.blocked[name] = action
                return
            elif name in self.work:  # a weights broadcast everyone reached: its cost first
                return
            action = None

    def meet(self, name, collective):
        """Arrive at `collective`; True (and the others released) when everyone has arrived."""
        arrived = self.arrived.setdefault(collective, set())
        arrived.add(name)
        if arrived != _members(self.run, collective):
            return False
        for other in arrived - {name}:
            del self.blocked[other]
            self.work[other] = self.run.sync_s if collective[0] == "weights" else 0.0
        if collective[0] == "weights":
            self.work[name] = self.run.sync_s
        return True

    def wake_receivers(self):
        for name, (kind, arg) in list(self.blocked.items()):
            if kind == "recv" and arg in self.posted:
                del self.blocked[name]
                self.advance(name)

    def step(self):
        """Advance time to the next work completion; False when every process has ended."""
        if not self.work:
            if self.blocked:
                raise RuntimeError(f"the schedule deadlocks at {self.now:.3f} s: {sorted(self.blocked)}")
            return False
        rate = min(1.0, self.run.cores / (len(self.work) + self.run.background))
        dt = min(self.work.values()) / rate
        self.now += dt
        for name in self.blocked:
            self.waited[name] += dt
        done = [name for name, left in self.work.items() if left - dt * rate <= 1e-12]
        self.work = {name: left - dt * rate for name, left in self.work.items() if name not in done}
        for name in done:
            self.advance(name)
        self.wake_receivers()
        return True


def simulate(run):
    """`{"total_s", "steps_per_s", "trainer_wait_s", "replica_wait_s"}` of `run` (waits: per step,
    trainer rank 0's and the replicas' mean)."""
    sim = _Simulation(run)
    for name in sim.programs:
        sim.advance(name)
    sim.wake_receivers()
    while sim.step():
        pass
    replicas = [sim.waited[("replica", r)] for r in range(run.replicas)]
    return {"total_s": sim.now, "steps_per_s": run.steps / sim.now,
            "trainer_wait_s": sim.waited[("trainer", 0)] / run.steps,
            "replica_wait_s": sum(replicas) / len(replicas) / run.steps}
