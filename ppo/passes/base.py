"""The seam between a PPO / GRPO step and the parallel strategy: every pass a step runs
through a model (generation, log-probs, values, scores, one optimiser step's gradients)
behind one interface. `ppo.passes.plain.PlainPasses` runs the models as they are (one
process, data parallel, sharding, tensor parallel); `ppo.strategy.pipeline.passes.PipelinePasses`
runs them as fleet pipelines. The run's strategy builds one (`ppo.strategy.Strategy.build_passes`);
the trainer never asks which; the passes never call the trainer: the losses come in as
`UpdateLosses`.

The split follows verl's workers (an actor / critic / reference / reward worker each offering
`compute_log_prob`, `compute_values`, `compute_rm_score`, `update_*` whatever the backend),
with the losses kept in the trainer so both strategies optimise the same objective.

Shapes: `N` rows of an experience, `Tr` response tokens, `n` rows of a micro-batch.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional


@dataclass(frozen=True)
class UpdateLosses:
    """The losses of one optimiser step, handed to `ModelPasses.backward_step`.

    actor: `(micro_exp, {"logprobs": [n, Tr], "entropy": [n, Tr] or None}) -> (loss, stats)`,
        the log-probs (and entropies) of the micro-batch under the actor being trained;
    critics: `{objective: (micro_exp, {"values": [n, Tr]}) -> (loss, stats)}`, one per scored
        objective with a critic (the reward's, a cost's), in the order their backward runs;
    next_ptx_batch: `() -> {"input_ids", "attention_mask", "labels"}` (`[m, T]` each), the
        next supervised batch, drawn once per micro-batch; None without ptx data;
    ptx_coeff: the ptx NLL's weight, split evenly over the step's micro-batches;
    with_entropy: whether the actor's loss reads the entropies.
    Every loss is already normalised by the whole step's token (or sequence) count."""

    actor: Callable
    critics: Dict[str, Callable] = field(default_factory=dict)
    next_ptx_batch: Optional[Callable] = None
    ptx_coeff: float = 0.0
    with_entropy: bool = True


class ModelPasses:
    """The passes of one PPO step. Subclasses implement every method; the no-gradient
    passes run under the caller's `paddle.no_grad()`.

    generation_model: the model the rollout engine is built with (filled with the actor's
    weights inside `generation_weights`)."""

    generation_model = None

    def generation_weights(self):
        """Context manager yielding the model to generate with, holding the actor's current
        weights for the block (collective under pipeline parallelism; blocks may nest)."""
        raise NotImplementedError

    def logprobs(self, which, exp):
        """Response log-probs `[N, Tr]` at the passes' temperature under the actor (`which`
        "actor") or the reference ("reference"), 0 outside the response mask."""
        raise NotImplementedError

    def values(self, objective, exp):
        """Values `[N, Tr]` of the critic of `objective` ("reward", "cost", ...), 0 outside
        the response mask."""
        raise NotImplementedError

    def scores(self, objective, exp):
        """End scores `[N]` (float32) of the score model of `objective` (the reward model, a
        cost model, ...)."""
        raise NotImplementedError

    def first_forward_reusable(self):
        """Whether the update's first forward can be run ahead (`first_forward`) and
        double as the old-policy pass."""
        raise NotImplementedError

    def first_forward(self, exp):
        """The training forward over all of `exp`'s rows, with gradients, run ahead of the update:
        `{"logprobs", "entropy", "values"}` (`[N, Tr]`; values: the first critic's, None without
        one). The passes keep nothing: the experience carries it (`Experience.first_forward`) and
        the updater hands it to the first `backward_step`. Only when `first_forward_reusable()`."""
        raise NotImplementedError

    def backward_step(self, exp, plan, losses, first_forward=None):
        """Gradients of one optimiser step: `plan` lists its micro-batches' row indices into
        `exp`, `losses` the `UpdateLosses`. Returns `(actor loss, value losses, stats)`: the
        losses summed over the micro-batches as floats (equal on every rank of a pipeline group),
        the value losses a dict `{objective: float}` of the critics the losses name, `stats`
        one dict per real micro-batch. The caller steps the optimisers. `first_forward`: a
        `first_forward(exp)` of all of `exp`'s rows with the current weights, to serve the first
        micro-batch instead of its forward (None: every micro-batch runs its own)."""
        raise NotImplementedError

    def group_sum(self, value):
        """`value` (a float about this rank's weights) summed over the ranks that hold other
        parts of the same model (the pipeline group); `value` itself when there are none."""
        raise NotImplementedError
