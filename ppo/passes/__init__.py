"""The model passes of a PPO step behind one interface (`ModelPasses`), built once per trainer
by `build_model_passes`: plain models, or fleet pipelines under `pipeline_parallel_degree > 1`."""
from .base import ModelPasses, UpdateLosses
from .plain import PlainPasses


def build_model_passes(args, models, actor, critic, optimizers, pad_token_id, reward_retokenizer=None, cost_critic=None):
    """The passes for this run's parallel strategy. `models`: `PPOModels` (unwrapped);
    `actor` / `critic`: the trained models as wrapped for data parallel or fleet;
    `optimizers`: `(actor optimizer, critic optimizer or None)`, wrapped alike; `args`: the
    PPO training arguments (`pipeline_parallel_degree`, `temperature`, `logprob_chunk_size`,
    batch sizes, `gradient_accumulation_steps`, `eval_mode`, `tensor_parallel_degree`);
    `reward_retokenizer`: re-encodes rollouts for a reward model with another tokenizer
    (`ppo.models.reward_tokens`; the pipeline run refuses one at start); `cost_critic`:
    PPO-Lagrangian's trained cost critic, wrapped as `critic` (the arguments refuse it under
    pipeline parallelism)."""
    if args.pipeline_parallel_degree > 1:
        from .pipeline import PipelinePasses

        return PipelinePasses(
            models, actor, critic, optimizers, temperature=args.temperature,
            micro_batches=args.gradient_accumulation_steps, micro_rows=args.per_device_train_batch_size,
            pad_token_id=pad_token_id,
            keep_tensor_parallel=args.eval_mode == "tensor_parallel" and args.tensor_parallel_degree > 1,
        )
    chunk_rows = max(args.per_device_eval_batch_size, args.per_device_train_batch_size)
    return PlainPasses(models, actor, critic, args.temperature, args.logprob_chunk_size, chunk_rows, reward_retokenizer,
                       cost_critic=cost_critic)


__all__ = ["ModelPasses", "PlainPasses", "UpdateLosses", "build_model_passes"]
