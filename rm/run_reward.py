"""Reward-model and cost-model training (full or LoRA) from a flat JSON argument file.

    python -m paddle.distributed.launch rm/run_reward.py config/tiny/rm_argument.json [--flag value ...]
    python rm/run_reward.py config/tiny/cost_argument.json   # score_type cost: a Safe RLHF cost model

Saves a score model loadable with `AutoModelForScore.from_pretrained(output_dir)`
(its normaliser statistics included); with `use_lora`, a score-model adapter (LoRA matrices,
score head, `score_normalizer.json`) on `model_name_or_path` (a full model or an SFT adapter,
merged in memory) that ppo/run_ppo.py loads as reward model and critic and
`sft/merge_lora.py` merges into a full score model; plus `metrics.jsonl`, `summary.json`,
`resolved_arguments.json` and VisualDL logs. `score_type cost` trains the same score model
(saved with `score_type: cost`) on safety pairs (`SafetyPreferenceDataset`) with the cost loss
of `rm/cost_trainer.py`; its loss is logged as `cost/loss`, its evaluation as `cost/*`.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("reward")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    from ppo.entry.argument_groups import split_specs  # noqa: E402
    from ppo.common.argument_parsing import save_resolved_arguments  # noqa: E402
    from ppo.common.output_lock import acquire_output_dir  # noqa: E402
    from ppo.common.startup_checks import StartupPass, token_and_position_problems  # noqa: E402
    from ppo.common.process_exit import run_and_exit  # noqa: E402
    from paddlenlp.trainer.trainer_utils import set_seed  # noqa: E402
    from ppo.entry.run_setup import finish_trainer_run  # noqa: E402
    from ppo.entry.trainer_callbacks import TrackerCallback  # noqa: E402
    from ppo.data import PreferenceDataset, ProcessRewardDataset, SafetyPreferenceDataset  # noqa: E402
    from ppo.models.loading import apply_lora, load_overrides, load_tokenizer  # noqa: E402
    from ppo.models.adapters import score_lora_settings  # noqa: E402
    from ppo.strategy import trainer_strategy  # noqa: E402
    from rm.reward_arguments import DataArgument, ModelArgument, RewardTrainingArguments, validate_arguments  # noqa: E402
    from rm.cost_trainer import CostTrainer  # noqa: E402
    from rm.process_reward_trainer import ProcessRewardTrainer  # noqa: E402
    from rm.reward_trainer import RewardTrainer  # noqa: E402
    from ppo.data.streaming import training_dataset  # noqa: E402

OBJECTIVES = {  # score_type (or process_reward) -> (dataset class, trainer class, name of the logged training loss)
    "reward": (PreferenceDataset, RewardTrainer, "rm/loss"),
    "cost": (SafetyPreferenceDataset, CostTrainer, "cost/loss"),
    "process": (ProcessRewardDataset, ProcessRewardTrainer, "prm/loss"),
}


def objective_name(model_args):
    """The key of `OBJECTIVES` a run trains: `process` with PaddleNLP's `process_reward`, else its `score_type`."""
    return "process" if model_args.process_reward else model_args.score_type


def dataset_settings(data_args, model_args):
    """Keyword arguments of the objective's dataset beyond the shared ones."""
    settings = dict(max_length=data_args.max_length, truncate_prompt_to=data_args.truncate_prompt_len)
    if model_args.process_reward:
        settings.update(placeholder_token=data_args.placeholder_token, reward_tokens=data_args.reward_tokens)
    return settings


def start_up(argv):
    """Arguments, tokenizer, the preference datasets and the model's embedding and positions,
    checked before the model loads; one error lists every problem."""
    startup = StartupPass()
    model_args, data_args, training_args = startup.parse((ModelArgument, DataArgument, RewardTrainingArguments), argv,
                                                         validate_arguments)
    tokenizer = startup.attempt(load_tokenizer, model_args.model_name_or_path)
    train_dataset = eval_dataset = None
    objective = OBJECTIVES.get(objective_name(model_args))  # None: refused by the argument checks
    if tokenizer is not None and objective is not None:
        dataset_class = objective[0]
        data_kwargs = dict(data_args.dataset_kwargs(tokenizer, training_args.seed), **dataset_settings(data_args, model_args))
        train_dataset = startup.attempt(training_dataset, dataset_class, split_specs(data_args.train_datasets), data_args.lazy,
                                        **data_kwargs)
        eval_specs = split_specs(data_args.eval_datasets)
        eval_dataset = startup.attempt(dataset_class, eval_specs, **data_kwargs) if eval_specs else None
        startup.add(token_and_position_problems(tokenizer, [("model_name_or_path", model_args.model_name_or_path)],
                                                data_args.max_length, "max_length"))
    startup.finish()
    return model_args, data_args, training_args, tokenizer, train_dataset, eval_dataset


def main(argv=None):
    model_args, data_args, training_args, tokenizer, train_dataset, eval_dataset = start_up(argv)
    acquire_output_dir(training_args.output_dir)  # one run per output_dir
    save_resolved_arguments(training_args.output_dir, model_args, data_args, training_args)
    set_seed(training_args.seed)  # fresh LoRA adapters and score heads start from the run's seed (PaddleNLP's llm scripts)
    _, trainer_class, loss_name = OBJECTIVES[objective_name(model_args)]
    score_settings = dict(
        score_type=model_args.score_type, do_normalize=model_args.normalize_score_during_training,
        normalizer_type=model_args.normalizer_type, normalizer_momentum=model_args.normalizer_momentum, **load_overrides(model_args, training_args, pipeline_entry="rm"),
    )
    if model_args.process_reward:  # saved in config.json: the PRM's scorer reads its placeholder from there
        score_settings.update(process_reward=True, placeholder_token=data_args.placeholder_token,
                              reward_tokens=data_args.reward_tokens)
    layout = trainer_strategy(training_args)  # pipeline: this rank's stages with the pairwise loss on the last
    layout.log_settings()
    model = layout.load_score_model(model_args.model_name_or_path, **score_settings)
    if model_args.use_lora:  # the adapter saves the LoRA matrices, the score head and (file) the normaliser
        model = apply_lora(
            model, base_model_name_or_path=model_args.model_name_or_path, **score_lora_settings(model_args.lora_settings()),
        )
    trainer = trainer_class(
        model=model,
        trainer_layout=layout,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=train_dataset.get_collator(),
        tokenizer=tokenizer,
        callbacks=[TrackerCallback(training_args.output_dir, loss_name=loss_name)],
        packed_length=data_args.max_length if data_args.zero_padding else None,
    )
    return finish_trainer_run(trainer, training_args, tokenizer)


if __name__ == "__main__":
    run_and_exit(main)
