"""Who does what in a split run (`rollout_placement split`): N trainer ranks beside M rollout ranks.

The launch's first N = world - M processes train (data parallel among themselves, rank t reading
data rank t); the last M (`rollout_ranks`) only generate. A trainer rank's step-b batch is a
"unit" `(b, t)`: exactly the draw colocated data rank t makes at step b (its prompt sampler,
its draw count, its rows' columns of the global uniforms), so what a unit holds never depends on
which replica generates it. Units are dealt round-robin in a fixed order, `(b, t)` to replica
`(b * N + t) mod M`; every replica walks all units in that order (generating its own, advancing
the others' prompt samplers without generating), and trainer rank t receives its units in
step order, each from the replica dealt it. So N = M pairs trainer t with replica t, N = 2,
M = 1 has the one replica generate trainer 0's then trainer 1's batch, and N = 1, M = 2
alternates the replicas from step to step (OpenRLHF's `vllm_num_engines` and verl's rollout
worker group, with a deal that makes the run reproducible).

Weights go from trainer rank 0 to every replica in one broadcast per dtype over the process
group of trainer 0 and the replicas (`weight_group_ranks`); the trainers' own collectives
(gradients, metrics, checkpoint barriers) run over the group of the trainer ranks
(`trainer_ranks`). Pure arithmetic: no process group is made here."""
from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutLayout:
    """`world`: the launch's processes; `rollout_ranks`: M, the last M of them."""

    world: int
    rollout_ranks: int

    @property
    def trainers(self):
        """N, the trainer ranks."""
        return self.world - self.rollout_ranks

    @property
    def trainer_ranks(self):
        return list(range(self.trainers))

    @property
    def replica_ranks(self):
        """The rollout ranks' global ranks, in replica order."""
        return list(range(self.trainers, self.world))

    @property
    def weight_group_ranks(self):
        """The ranks of the weights broadcast: trainer rank 0 (its source) and every replica."""
        return [0] + self.replica_ranks

    def is_replica(self, rank):
        return rank >= self.trainers

    def replica_of(self, batch, trainer):
        """The global rank of the replica that generates trainer rank `trainer`'s batch `batch`."""
        return self.trainers + (batch * self.trainers + trainer) % self.rollout_ranks

    def units(self, batch):
        """Every unit of batch `batch` in the fixed order: `[(trainer, replica rank), ...]`."""
        return [(t, self.replica_of(batch, t)) for t in range(self.trainers)]

    def served_trainers(self, replica):
        """The trainer ranks replica `replica` generates for at some step (ascending)."""
        batches = range(self.rollout_ranks)  # the deal repeats every M batches
        return sorted({t for b in batches for t, r in self.units(b) if r == replica})
