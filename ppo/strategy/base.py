"""A run's parallel strategy: how its models meet its processes. One object owns what depends on
the layout: wrapping the trained models and optimisers, the passes a step runs through the
models (`ppo.passes`), one optimiser step with its gradient sync and norm, saving and loading
model weights, and the group the rollout engine generates over. The trainer's parts call it and
never ask which strategy it is; `build_strategy` picks it once from the arguments.

A layout is one folder (`ppo.strategy.tensor`, `ppo.strategy.pipeline`) whose strategy
subclasses `Strategy` alone and composes the axes it runs on (`FleetAxes`, `TensorAxis`, ...);
no strategy inherits another (docs/architecture.md)."""
import math
from dataclasses import dataclass, field
from typing import Dict

import paddle

from .ranks import Ranks


def first_non_finite(named_tensors):
    """Name of the first tensor holding NaN/Inf, or None."""
    for name, t in named_tensors:
        if t is not None and not bool(paddle.isfinite(t).all()):
            return name
    return None


@dataclass(frozen=True)
class PassSettings:
    """What the passes need besides the models: the log-probs' `temperature` and LM-head
    `logprob_chunk_size`, rows per no-gradient forward (`chunk_rows`: `{"logprob", "value",
    "reward"}`), `remove_padding`, the update's `micro_batches` per optimiser step and
    `micro_rows` per micro-batch, the `pad_token_id`, `keep_tensor_parallel` (`eval_mode`
    tensor_parallel: generate from each rank's slices where a strategy splits them) and `retokenizers` (`{objective: tokenizer}` of score models whose
    tokenizer differs from the actor's) and `logprob_dtype` (of the log-prob passes' softmax: float32, or
    the training dtype with PaddleNLP's `use_fp32_compute` off)."""

    temperature: float
    logprob_chunk_size: int
    chunk_rows: Dict[str, int]
    pad_token_id: int
    micro_batches: int = 1
    micro_rows: int = 1
    remove_padding: bool = False
    keep_tensor_parallel: bool = False
    retokenizers: Dict[str, object] = field(default_factory=dict)
    logprob_dtype: str = "float32"


def whole_model_passes(models, actor, critics, settings):
    """`PlainPasses`: every model runs whole layers in this process (one process, data parallel,
    tensor parallel with its slices)."""
    from ..passes.plain import PlainPasses

    return PlainPasses(models, actor, critics, settings.temperature, settings.logprob_chunk_size, settings.chunk_rows,
                       retokenizers=settings.retokenizers, remove_padding=settings.remove_padding,
                       logprob_dtype=settings.logprob_dtype)


class Strategy:
    """The layout of one run (see the module docstring). `ranks`: its `Ranks`."""

    name = "strategy"

    def __init__(self, ranks=None):
        self.ranks = ranks or Ranks()

    @classmethod
    def from_args(cls, ranks, args):
        """The layout's strategy on `ranks` for the run's arguments (`build_strategy`): `cls(ranks)`
        unless the layout reads an argument itself."""
        return cls(ranks)

    # ---- loading, wrapping and passes ----------------------------------------------------
    def load_models(self, model_args, use_critic, dtype="float32", **extra):
        """The run's `PPOModels` in this layout (whole models by default,
        `ppo.models.ppo_models.build_ppo_models`); `extra`: config overrides."""
        from ..models.ppo_models import build_ppo_models

        return build_ppo_models(model_args, use_critic, dtype, **extra)

    def log_settings(self, args):
        """Log what the layout makes of the arguments (nothing by default)."""

    def wrap(self, model, optimizer):
        """`(model, optimizer)` wrapped for the run's ranks (as they are when `model` is None)."""
        raise NotImplementedError

    def build_passes(self, models, actor, critics, optimizers, settings):
        """The `ModelPasses` of a step: `models` the unwrapped `PPOModels`, `actor` / `critics`
        (`{objective: critic}`) / `optimizers` (`{"actor" or objective: optimizer}`) as `wrap`
        gave them, `settings` a `PassSettings`."""
        raise NotImplementedError

    # ---- one optimiser step --------------------------------------------------------------
    def prepare_step(self, model, optimizer):
        """`ppo.strategy.grad_sync.PreparedStep`: gradients synced as the optimiser's step
        would sync them, the parameters this rank counts and the step itself."""
        from .grad_sync import prepare_step

        return prepare_step(model, optimizer)

    def gradient_groups(self):
        """`(model-parallel group, pipeline group)` the squared gradient norm is summed over."""
        return None, None

    def expert_group(self):
        """The group the experts' squared gradient norm is summed over first (expert
        parallelism: each rank holds other experts); None without it."""
        return None

    def optimizer_step(self, model, optimizer, loss_value, name, release_gradients=False):
        """Step unless the loss or a gradient is non-finite on some rank. Returns `(bad, norm)`:
        what was non-finite (None when stepped) and the gradient norm before clipping (None when
        not stepped or nothing has a gradient). The norm and the check see the gradients after
        the optimiser's own sync, so all ranks agree."""
        from ..optimization.stepped import zero_missing_gradients
        from .grad_sync import squared_grad_norm

        zero_missing_gradients(optimizer)  # a parameter stepped before is stepped again, also after a resume
        where = " (on this or another rank)" if self.ranks.world_size > 1 else ""
        bad = None if not self.ranks.any(not math.isfinite(loss_value)) else f"loss of the {name}{where}"
        prepared = self.prepare_step(model, optimizer)
        # collective (model-parallel / sharding groups): every rank computes it, even with nothing to count
        model_parallel, pipeline = self.gradient_groups()
        total = squared_grad_norm(prepared.params, model_parallel, prepared.sharding_group, pipeline, self.expert_group())
        norm = None
        if bad is None and not math.isfinite(total):  # one host sync; search names only when needed
            grads = [(f"{name} grad of {p.name}", p.grad) for p in prepared.params]
            bad = first_non_finite(grads) or f"{name} gradient slice on another tensor-parallel or sharding rank"
        elif bad is None and prepared.params:
            norm = math.sqrt(total)
        if bad is None:
            prepared.step()
        optimizer.clear_grad(set_to_zero=not release_gradients)  # release_grads: free, not zero
        return bad, norm

    # ---- model weights on disk -----------------------------------------------------------
    def saves_models(self):
        """Whether this rank takes part in writing model directories."""
        return self.ranks.is_main

    def save_model(self, model, path, tokenizer=None):
        """`save_pretrained` of the innermost model into `path` (LoRA adapters as adapters), as
        one plain checkpoint a single process loads; every rank `saves_models` names calls it."""
        from ..models.loading import unwrap_parallel

        unwrap_parallel(model).save_pretrained(path)
        if tokenizer is not None and self.ranks.is_main:
            tokenizer.save_pretrained(path)

    def save_trainer_model(self, trainer, path, merge_tensor_parallel=None):
        """The final model of a PaddleNLP `Trainer` run (SFT, reward model, DPO) written to
        `path` as one checkpoint a single process loads (`merge_tensor_parallel`: its
        tensor-parallel slices merged; None: when the run's `tensor_parallel_degree` splits them)."""
        if merge_tensor_parallel is None:
            merge_tensor_parallel = trainer.args.tensor_parallel_degree > 1
        trainer.save_model(path, merge_tensor_parallel=merge_tensor_parallel)

    def load_weights(self, model, state_dict):
        """Load a saved (single-process) state dict into `model` in place."""
        from ..models.loading import unwrap_parallel

        unwrap_parallel(model).set_state_dict(state_dict)

    # ---- generation and bookkeeping ------------------------------------------------------
    def generation_copy(self, model):
        """Context giving a model that generates whole on this rank from `model`'s current
        weights: `model` itself unless the layout splits it into stages."""
        import contextlib

        return contextlib.nullcontext(model)

    def generation_group(self):
        """The group the rollout engine all-reduces over when it generates from each rank's
        tensor-parallel slices; None when it generates from whole weights."""
        return None

    def fingerprint(self, model, passes):
        """One float per rank summarising the whole (merged) `model`'s weights; equal on every
        rank when in sync."""
        params = list(model.parameters())
        value = sum(float((p.astype("float64") * (i + 1)).sum()) for i, p in enumerate(params) if not p.is_distributed)
        value += self.split_weight_sum([float((p.astype("float64") * (i + 1)).sum())
                                        for i, p in enumerate(params) if p.is_distributed])
        value = passes.group_sum(value)  # pipeline stages hold other layers: their sum
        return [float(v[0]) for v in self.ranks.gather([value])]

    def split_weight_sum(self, sums):
        """The whole weights' number of tensor-parallel slices' `sums` (this rank's)."""
        return sum(sums)

