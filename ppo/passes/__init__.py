"""The model passes of a PPO step behind one interface (`ModelPasses`), built once per trainer
by `build_model_passes`: plain models, or fleet pipelines under `pipeline_parallel_degree > 1`;
`wrap_for_ranks` wraps the trained models and optimisers for the run's ranks first."""
import paddle
import paddle.distributed as dist

from .base import ModelPasses, UpdateLosses
from .plain import PlainPasses


def wrap_for_ranks(args, model, optimizer):
    """`(model, optimizer)` wrapped for the run's ranks: fleet's wrappers under hybrid parallel
    (sharding, tensor or pipeline parallel), `paddle.DataParallel` for data parallel alone, as
    they are on one rank or when `model` is None."""
    if model is None or dist.get_world_size() == 1:
        return model, optimizer
    if args.use_hybrid_parallel:
        from paddle.distributed import fleet

        return fleet.distributed_model(model), fleet.distributed_optimizer(optimizer)
    return paddle.DataParallel(model), optimizer


def build_model_passes(args, models, actor, critic, optimizers, pad_token_id, reward_retokenizer=None, cost_critic=None):
    """The passes for this run's parallel strategy. `models`: `PPOModels` (unwrapped);
    `actor` / `critic`: the trained models as wrapped for data parallel or fleet;
    `optimizers`: `(actor optimizer, critic optimizer or None)`, wrapped alike; `args`: the
    PPO training arguments (`pipeline_parallel_degree`, `temperature`, `logprob_chunk_size`,
    batch sizes, `gradient_accumulation_steps`, `keep_tensor_parallel` (eval_mode), `tensor_parallel_degree`);
    `reward_retokenizer`: re-encodes rollouts for a reward model with another tokenizer
    (`ppo.models.reward_tokens`; the pipeline run refuses one at start); `cost_critic`:
    PPO-Lagrangian's trained cost critic, wrapped as `critic` (the arguments refuse it under
    pipeline parallelism)."""
    if args.pipeline_parallel_degree > 1:
        from .pipeline import PipelinePasses

        return PipelinePasses(
            models, actor, critic, optimizers, temperature=args.temperature,
            micro_batches=args.update_accumulation_steps, micro_rows=args.update_micro_rows,
            pad_token_id=pad_token_id,
            keep_tensor_parallel=args.keep_tensor_parallel and args.tensor_parallel_degree > 1,
        )
    chunk_rows = {which: args.pass_rows(which) for which in ("logprob", "value", "reward")}
    return PlainPasses(models, actor, critic, args.temperature, args.logprob_chunk_size, chunk_rows, reward_retokenizer,
                       remove_padding=args.use_remove_padding, cost_critic=cost_critic)


__all__ = ["ModelPasses", "PlainPasses", "UpdateLosses", "build_model_passes", "wrap_for_ranks"]
