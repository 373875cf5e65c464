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

With tensor parallelism on either side the deal is the same over bigger units of ranks: a
trainer tensor-parallel group of `trainer_tp` consecutive ranks is one data rank (`data_rank`:
t // trainer_tp; each of its ranks receives the unit's batch), and a replica of `rollout_tp`
consecutive rollout ranks is one replica (its first rank, the `leader`, is named in the deal and
sends the batches; every rank of it generates). Unit (b, d) goes to replica (b * D + d) mod R
of the D = N / trainer_tp data ranks and R = M / rollout_tp replicas.

Weights go from trainer rank 0 to every rollout rank in one broadcast per dtype over the process
group of trainer 0 and the rollout ranks (`weight_group_ranks`), whole (a tensor-parallel trainer
gathers its slices first). With `rollout_tp` > 1 each replica rank holds only its slice, and
weights go as `rollout_tp` broadcasts per dtype, slice j over the group of trainer 0 and rank j
of every replica (`weight_shard_ranks`), so each rollout rank receives one broadcast per dtype
of its slice only; the
trainers' own collectives (gradients, metrics, checkpoint barriers) run over the group of the
trainer ranks (`trainer_ranks`). Pure arithmetic: no process group is made here."""
from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutLayout:
    """`world`: the launch's processes; `rollout_ranks`: M, the last M of them; `trainer_tp`: the
    trainer's tensor-parallel degree (a group of that many consecutive trainer ranks is one data
    rank); `rollout_tp`: each replica's tensor-parallel degree (that many consecutive rollout
    ranks generate together; the first of them, its leader, sends the batches)."""

    world: int
    rollout_ranks: int
    trainer_tp: int = 1
    rollout_tp: int = 1

    @property
    def trainers(self):
        """N, the trainer ranks."""
        return self.world - self.rollout_ranks

    @property
    def data_ranks(self):
        """D, the trainer's data ranks (N / trainer_tp)."""
        return self.trainers // self.trainer_tp

    @property
    def replicas(self):
        """R, the rollout replicas (M / rollout_tp)."""
        return self.rollout_ranks // self.rollout_tp

    @property
    def trainer_ranks(self):
        return list(range(self.trainers))

    @property
    def replica_ranks(self):
        """Every rollout rank's global rank, in replica order."""
        return list(range(self.trainers, self.world))

    @property
    def weight_group_ranks(self):
        """The ranks of the weights broadcast: trainer rank 0 (its source) and every rollout rank."""
        return [0] + self.replica_ranks

    def weight_shard_ranks(self, shard):
        """The ranks of the broadcast of slice `shard` of the weights: trainer rank 0 (its source)
        and rank `shard` of every replica (`weight_group_ranks` at `rollout_tp` 1)."""
        return [0] + self.replica_ranks[shard::self.rollout_tp]

    def weight_shard(self, rank):
        """The slice of the weights rollout rank `rank` holds: its index in its replica."""
        return (rank - self.trainers) % self.rollout_tp

    def is_replica(self, rank):
        return rank >= self.trainers

    def data_rank(self, trainer):
        """The data rank of trainer rank `trainer` (fleet's model axis is the innermost)."""
        return trainer // self.trainer_tp

    def data_rank_trainers(self, data_rank):
        """The trainer ranks of data rank `data_rank` (its tensor-parallel group), ascending."""
        return list(range(data_rank * self.trainer_tp, (data_rank + 1) * self.trainer_tp))

    def leader(self, rank):
        """The first rank (the one that sends batches) of rollout rank `rank`'s replica."""
        return self.trainers + (rank - self.trainers) // self.rollout_tp * self.rollout_tp

    def replica_members(self, rank):
        """The rollout ranks of `rank`'s replica (its tensor-parallel group), ascending."""
        first = self.leader(rank)
        return list(range(first, first + self.rollout_tp))

    def replica_of(self, batch, data_rank):
        """The leader's global rank of the replica that generates data rank `data_rank`'s batch `batch`."""
        return self.trainers + (batch * self.data_ranks + data_rank) % self.replicas * self.rollout_tp

    def units(self, batch):
        """Every unit of batch `batch` in the fixed order: `[(data rank, replica leader), ...]`."""
        return [(d, self.replica_of(batch, d)) for d in range(self.data_ranks)]

    def served_data_ranks(self, rank):
        """The data ranks rollout rank `rank`'s replica generates for at some step (ascending)."""
        leader, batches = self.leader(rank), range(self.replicas)  # the deal repeats every R batches
        return sorted({d for b in batches for d, r in self.units(b) if r == leader})

    def served_trainers(self, rank):
        """The trainer ranks rollout rank `rank`'s replica generates for at some step (ascending)."""
        return [t for d in self.served_data_ranks(rank) for t in self.data_rank_trainers(d)]
