"""Where the rollout runs (`rollout_placement`) and how stale its weights may be (`async_staleness`).

`colocated` (the default) generates and trains on the same ranks, one after the other.
`split` gives the last `rollout_ranks` M processes of the launch to generation only: they
receive the actor's weights after each optimiser step and send back the batches
(`ppo.trainer.remote_rollout`, `ppo.trainer.rollout_worker`, docs/distributed.md). The first
N = world - M processes train, data and tensor parallel among themselves; the batches are dealt
to the rollout replicas (of `rollout_tensor_parallel_degree` ranks each) in a fixed order
(`ppo.strategy.rollout_layout`). With
`async_staleness` s > 0 the batch of step k may come from the weights of step k - s (generated
while the trainer trains), corrected by the rollout importance weights (`rollout_is`).
`partial_rollout` lets a response span a weight update (slime, AReaL): its tokens carry the
versions that sampled them (`ppo.rollout.partial`, `ppo.trainer.rollout_worker`).
`rollout_placement_problems` refuses, before any model loads, what a split run cannot do.
"""
from dataclasses import dataclass, field
from typing import ClassVar


ROLLOUT_PLACEMENTS = ("colocated", "split")
MAX_ASYNC_STALENESS = 4


def launch_world_size():
    """The processes of this launch (1 outside `paddle.distributed.launch`)."""
    import paddle.distributed as dist

    return dist.get_world_size()


@dataclass
class RolloutPlacementArguments:
    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"rollout_placement": "ppo.entry.rollout_placement_arguments:ROLLOUT_PLACEMENTS"}
    rollout_placement: str = field(
        default="colocated",
        metadata={"help": "colocated: every rank generates then trains (one after the other); split: the last "
                  "rollout_ranks processes of the launch only generate, the others only train (data parallel), the "
                  "weights go from rank 0 to the rollout ranks after each optimiser step and batches come back "
                  "(docs/distributed.md)."},
    )
    rollout_ranks: int = field(
        default=1, metadata={"help": "rollout_placement split: how many of the launch's processes (the last ones) only "
                             "generate, as rollout_ranks / rollout_tensor_parallel_degree replicas of the actor of that "
                             "many consecutive ranks each; the rest train (OpenRLHF's vllm_num_engines)."}
    )
    async_staleness: int = field(
        default=0,
        metadata={"help": f"rollout_placement split: 0 generates step k's batch with the weights after step k "
                  f"(synchronous, the colocated run's numbers); s in 1..{MAX_ASYNC_STALENESS} lets it come from the "
                  "weights of step k - s while the trainer trains (one-step-off-policy at 1); needs rollout_is."},
    )

    partial_rollout: bool = field(
        default=False,
        metadata={"help": "rollout_placement split with async_staleness >= 1: batch k starts under the weights of step "
                  "k - s and, after partial_rollout_tokens tokens of every response, continues under those of step "
                  "k - s + 1 (re-prefilled); each token records the version that sampled it, the staleness bound holds "
                  "per token and the rollout correction uses each token's own log-prob (slime / AReaL partial rollouts)."},
    )
    partial_rollout_tokens: int = field(
        default=8,
        metadata={"help": "partial_rollout: the tokens every response generates under the older weights before the "
                  "update is taken (the first chunk of the interruptible generation; the rest follows in one chunk, "
                  "re-prefilled under the new weights); below max_dec_len."},
    )

    def resolve_group(self):
        return rollout_placement_problems(self, launch_world_size())

    @property
    def split_rollout(self):
        """Whether the rollout runs on ranks of its own."""
        return self.rollout_placement == "split"

    @property
    def is_rollout_rank(self):
        """Whether this process only generates (a split run's last `rollout_ranks` ranks)."""
        import paddle.distributed as dist

        return self.split_rollout and dist.get_rank() >= launch_world_size() - self.rollout_ranks

    @property
    def training_world_size(self):
        """The processes that train: the launch's, less the rollout ranks of a split run."""
        return launch_world_size() - (self.rollout_ranks if self.split_rollout else 0)

    @property
    def dataset_world_size(self):
        # a split run's data ranks are its trainer ranks, a tensor-parallel group of them counted once
        # (PaddleNLP's property counts every process)
        if not self.split_rollout:
            return super().dataset_world_size
        return self.training_world_size // max(self.tensor_parallel_degree, 1)

    @property
    def dataset_rank(self):
        if not self.split_rollout:
            return super().dataset_rank
        import paddle.distributed as dist

        # trainer rank t reads data rank t // tensor_parallel_degree (fleet's model axis is the innermost)
        return 0 if self.is_rollout_rank else dist.get_rank() // max(self.tensor_parallel_degree, 1)


def rollout_placement_problems(args, world_size):
    """What a run with these placement settings cannot do, each naming its key; `world_size`:
    the launch's processes."""
    problems = []
    if args.rollout_placement not in ROLLOUT_PLACEMENTS:
        return [f"rollout_placement must be one of {ROLLOUT_PLACEMENTS}, got {args.rollout_placement!r}"]
    if not 0 <= args.async_staleness <= MAX_ASYNC_STALENESS:
        problems.append(f"async_staleness must be in 0..{MAX_ASYNC_STALENESS} (batches at most that many optimiser steps "
                        f"behind), got {args.async_staleness}")
    problems += partial_rollout_problems(args, world_size)
    if not args.split_rollout:
        if args.async_staleness:
            problems.append("async_staleness > 0 needs rollout_placement split (a colocated rollout always uses the "
                            "current weights)")
        return problems
    if world_size < 2:
        problems.append("rollout_placement split needs a launch of 2 processes or more (python -m "
                        "paddle.distributed.launch --nproc_per_node 2 ...: rank 0 trains, rank 1 generates); this run has 1")
    elif not 1 <= args.rollout_ranks < world_size:
        problems.append(f"rollout_ranks {args.rollout_ranks} with {world_size} processes: a split run needs at least one "
                        "rollout rank and one trainer rank (the first processes - rollout_ranks train)")
    problems += split_degree_problems(args, world_size)
    if not args.use_fusemt:
        problems.append("use_fusemt false with rollout_placement split: the rollout rank reproduces the trainer's samples "
                        "from the engine's seeded draws; PaddleNLP's generate draws from the process's global generator")
    if args.dynamic_sampling:
        problems.append("dynamic_sampling with rollout_placement split: redrawing a step's groups is not implemented "
                        "across ranks")
    if args.env_name:
        problems.append("env_name with rollout_placement split: multi-turn rollouts run colocated only")
    if getattr(args, "early_stopping", False):
        problems.append("early_stopping with rollout_placement split: the rollout rank serves every step up to max_steps, "
                        "a run that ends earlier is not implemented")
    if args.async_staleness > 0 and args.rollout_is == "none":
        problems.append(f"async_staleness {args.async_staleness} with rollout_is none: stale batches need the importance "
                        "weights of the rollout correction (rollout_is token or sequence)")
    return problems


def partial_rollout_problems(args, world_size=2):
    """What `partial_rollout` cannot be combined with, each naming its key."""
    if not getattr(args, "partial_rollout", False):
        return []
    problems = []
    if not args.split_rollout or args.async_staleness < 1:
        problems.append("partial_rollout needs rollout_placement split with async_staleness >= 1: only there does a "
                        "weight update arrive while a batch is generated (a colocated or synchronous rollout always "
                        "samples a batch with one version)")
    if not 1 <= args.partial_rollout_tokens < args.max_dec_len:
        problems.append(f"partial_rollout_tokens {args.partial_rollout_tokens} must be in 1..max_dec_len - 1 "
                        f"({args.max_dec_len - 1}): the tokens a response generates before the update")
    if getattr(args, "moe_routing_replay", "none") == "rollout":
        problems.append("moe_routing_replay rollout with partial_rollout: the experts of re-prefilled chunks are not "
                        "recorded")
    return problems


def split_degree_problems(args, world_size):
    """The trainer's and the rollout's parallel degrees a split run cannot take, each naming its key."""
    problems = []
    for name in ("pipeline_parallel_degree", "sharding_parallel_degree"):
        if max(getattr(args, name, 1), 1) > 1:
            problems.append(f"{name} {getattr(args, name)} with rollout_placement split: the trainer ranks train data "
                            "and tensor parallel only (pipeline stages and sharding beside rollout ranks are not implemented)")
    tp, trainers = max(getattr(args, "tensor_parallel_degree", 1), 1), world_size - args.rollout_ranks
    if tp > 1 and (trainers % tp or world_size % tp):
        problems.append(f"tensor_parallel_degree {tp} with rollout_placement split needs the trainer ranks ({trainers}) and "
                        f"the launch's processes ({world_size}) to divide by it (fleet's topology spans the whole launch)")
    rollout_tp = getattr(args, "rollout_tensor_parallel_degree", -1)
    if rollout_tp > 1 and args.rollout_ranks % rollout_tp:
        problems.append(f"rollout_tensor_parallel_degree {rollout_tp} with rollout_placement split needs rollout_ranks "
                        f"({args.rollout_ranks}) to divide by it (each replica is that many consecutive rollout ranks)")
    return problems
