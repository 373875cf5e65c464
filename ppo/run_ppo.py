"""PPO / GRPO training from a flat JSON argument file.

    python -m paddle.distributed.launch ppo/run_ppo.py config/llama/ppo_argument.json [--flag value ...]
    cd ppo && python -m paddle.distributed.launch run_ppo.py config/llama/ppo_argument.json

Writes `output_dir/policy` and `output_dir/value` (PaddleNLP layout),
`checkpoint-<step>/` for resume, `metrics.jsonl`, `samples.jsonl`, `summary.json`,
`resolved_arguments.json` and VisualDL logs.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import logging  # noqa: E402

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("ppo")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    import paddle  # noqa: E402

    from ppo.entry.argument_groups import split_specs  # noqa: E402
    from ppo.common.argument_parsing import save_resolved_arguments  # noqa: E402
    from ppo.common.paddlenlp_keys import batch_knob_messages, inert_setting_messages  # noqa: E402
    from ppo.common.process_exit import run_and_exit  # noqa: E402
    from ppo.data import PromptOnlyDataset, SupervisedDataset  # noqa: E402
    from ppo.models.loading import enable_recompute, load_overrides, load_tokenizer, training_dtype  # noqa: E402
    from ppo.models.ppo_models import PPOModels, load_actor  # noqa: E402
    from ppo.models.loading import load_reference  # noqa: E402
    from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments, validate_arguments  # noqa: E402
    from ppo.entry.ppo_trainer import build_ppo_trainer, build_rollout_worker  # noqa: E402
    from ppo.strategy import build_strategy  # noqa: E402
    from ppo.strategy.rollout_link import open_split_world, run_link  # noqa: E402
    from ppo.trainer.scoring import score_sources  # noqa: E402
    from ppo.models.reward_tokens import check_cost_tokenizers, embedding_limit_problems, retokenizer_for_run  # noqa: E402
    from ppo.common.output_lock import acquire_output_dir  # noqa: E402
    from ppo.common.startup_checks import StartupPass  # noqa: E402
    from ppo.serving.reward_client import run_server_problems  # noqa: E402
    from ppo.agents.prompt_room import prompt_room_problems  # noqa: E402
    from ppo.agents.record_env import record_environment_problems  # noqa: E402

logger = logging.getLogger("ppo")


def build_datasets(data_args, training_args, tokenizer, require_label=False, attempt=None):
    """Train prompts (each with its reference answer when `require_label`: a reward server
    scores against it), eval prompts and ptx data. `attempt` (`StartupPass.attempt`) builds each,
    so that a problem in one still lets the others be checked."""
    attempt = attempt or (lambda build, *args, **kwargs: build(*args, **kwargs))
    common = data_args.dataset_kwargs(tokenizer, training_args.seed)
    keys = data_args.prompt_field_keys()  # the prompt data's field names; ptx data keeps its format's
    train = attempt(PromptOnlyDataset, split_specs(data_args.train_datasets), max_prompt_len=data_args.max_prompt_len,
                    require_label=require_label, **keys, **common)
    eval_specs = split_specs(data_args.eval_datasets)
    evaluation = (attempt(PromptOnlyDataset, eval_specs, max_prompt_len=data_args.max_prompt_len, **keys, **common)
                  if eval_specs else None)
    ptx_specs = split_specs(data_args.ptx_datasets)
    ptx = attempt(SupervisedDataset, ptx_specs, max_length=data_args.max_length, **common) if ptx_specs else None
    return train, evaluation, ptx


def sequence_limit(data_args, training_args):
    """`(longest sequence the models read, the arguments that set it)`: a multi-turn trajectory's
    `max_total_len`, else `max_prompt_len + max_dec_len`."""
    if training_args.env_name:
        return training_args.max_total_len, "max_total_len"
    return data_args.max_prompt_len + training_args.max_dec_len, "max_prompt_len + max_dec_len"


def start_up(argv=None):
    """The start-up pass, before any model loads: arguments, the actor's tokenizer, the datasets
    (data files read and tokenised), the tokenizers of the reward and cost models, every model's
    embedding and positions against its tokenizer (a multi-turn run's `max_total_len` too, and its
    prompts as the rollout starts them), the reward server. Raises one error listing
    every problem; returns `(model_args, data_args, training_args, tokenizer, datasets, retokenizer)`."""
    startup = StartupPass()
    model_args, data_args, training_args = startup.parse((ModelArgument, DataArgument, PPOTrainingArguments), argv,
                                                         validate_arguments)
    tokenizer = startup.attempt(load_tokenizer, model_args.actor_model_name_or_path)
    datasets = retokenizer = None
    if tokenizer is not None:
        datasets = build_datasets(data_args, training_args, tokenizer, model_args.external_scores, startup.attempt)
        retokenizer = startup.attempt(retokenizer_for_run, model_args, training_args.use_critic, tokenizer,
                                      pipeline=training_args.pipeline_parallel_degree > 1)
        startup.add(record_environment_problems(training_args, datasets[0]))  # a record's own env_name / env_kwargs
        startup.add(record_environment_problems(training_args, datasets[1], "eval_datasets"))
        startup.attempt(check_cost_tokenizers, model_args, tokenizer)  # PPO-Lagrangian
        startup.add(embedding_limit_problems(model_args, training_args.use_critic, tokenizer, retokenizer,
                                             *sequence_limit(data_args, training_args)))
        startup.add(startup.attempt(prompt_room_problems, training_args, datasets[0], tokenizer) or [])  # multi-turn
    startup.add(run_server_problems(model_args))
    startup.finish()
    return model_args, data_args, training_args, tokenizer, datasets, retokenizer


def rollout_rank_worker(model_args, training_args, tokenizer, train):
    """A split run's rollout rank: the actor alone, with its reference when the run has a KL to
    it (the rollout rank then computes the reference log-probs)."""
    dtype, overrides = training_dtype(training_args), load_overrides(model_args, training_args, pipeline_entry="ppo")
    for key in ("tensor_parallel_degree", "tensor_parallel_rank", "tensor_parallel_output"):  # a whole copy
        overrides.pop(key, None)
    actor = load_actor(model_args, dtype, **overrides)
    models = None
    # the reference log-probs here only when the trainer's own pass would compute the same numbers
    # (a tensor-parallel trainer sums its reference's slices in another order: it computes them)
    link = run_link()  # the reference pass runs on a replica's leader only
    if (training_args.kl_coeff != 0 or training_args.kl_loss_coeff != 0) and training_args.tensor_parallel_degree <= 1 \
            and link.rank == link.layout.leader(link.rank):
        reference = load_reference(actor, model_args.actor_model_name_or_path, model_args.reference_model_name_or_path,
                                   dtype, **overrides)
        models = PPOModels(actor=actor, reference=reference, reward=None, critic=None)
    return build_rollout_worker(training_args, actor, tokenizer, train, models)


def build_trainer(argv=None, strategy=None):
    """Parse and check the arguments (`start_up`), load the models and return the run's ready
    `ppo.trainer.loop.OnlineLoop`; `strategy`: the parallel strategy (default: the arguments')."""
    model_args, data_args, training_args, tokenizer, (train, evaluation, ptx), retokenizer = start_up(argv)
    acquire_output_dir(training_args.output_dir, dist_rank() == 0)  # one run per output_dir
    if dist_rank() == 0:
        save_resolved_arguments(training_args.output_dir, model_args, data_args, training_args)
        for message in inert_setting_messages(training_args) + batch_knob_messages(model_args, training_args):
            logger.warning(message)
    paddle.seed(training_args.seed + training_args.dataset_rank)  # tensor-parallel ranks draw alike
    if training_args.split_rollout:  # the groups of the trainer ranks and of the weights, on every rank
        open_split_world(paddle.distributed.get_world_size(), training_args.rollout_ranks,
                         max(training_args.tensor_parallel_degree, 1), max(training_args.rollout_tensor_parallel_degree, 1))
    if training_args.is_rollout_rank:  # rollout_placement split: this rank only generates
        return rollout_rank_worker(model_args, training_args, tokenizer, train)
    strategy = strategy or build_strategy(training_args)  # the layout: it loads the models in it
    strategy.log_settings(training_args)
    models = strategy.load_models(model_args, training_args.use_critic, training_dtype(training_args),
                                  **load_overrides(model_args, training_args, pipeline_entry="ppo"))
    if training_args.recompute:
        enable_recompute(models.actor, model_args.recompute_granularity, model_args.recompute_use_reentrant)
    if training_args.critic_recompute and models.critic is not None:
        enable_recompute(models.critic, training_args.critic_recompute_granularity, model_args.recompute_use_reentrant)
    client, rule_scorer = score_sources(model_args)
    return build_ppo_trainer(
        training_args, models, tokenizer, train, evaluation, ptx, reward_client=client,
        eval_long_answer_len=data_args.eval_long_answer_len, rule_scorer=rule_scorer, reward_retokenizer=retokenizer,
        strategy=strategy,
    )


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s %(levelname)s: %(message)s")
    trainer = build_trainer(argv)
    summary = trainer.train()
    if dist_rank() == 0:
        print(trainer.closing_text(summary), flush=True)
    return summary


def dist_rank():
    return paddle.distributed.get_rank()


if __name__ == "__main__":
    run_and_exit(main)
