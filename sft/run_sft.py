"""Supervised fine-tuning (full or LoRA) from a flat JSON argument file.

    python -m paddle.distributed.launch sft/run_sft.py config/tiny/sft_argument.json [--flag value ...]

Writes the model (or adapter) to `output_dir` with `metrics.jsonl`, `summary.json`,
`resolved_arguments.json` and VisualDL logs under `logging_dir`. Merge a LoRA
run into a full model with `python sft/merge_lora.py --lora_path OUT --output_dir MERGED`.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("sft")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

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
    from ppo.data import PromptOnlyDataset, SupervisedDataset  # noqa: E402
    from ppo.models.loading import apply_lora, load_overrides, load_tokenizer  # noqa: E402
    from ppo.strategy import trainer_strategy  # noqa: E402
    from sft.sft_arguments import DataArgument, ModelArgument, SFTTrainingArguments, validate_arguments  # noqa: E402
    from sft.sft_trainer import SFTTrainer  # noqa: E402
    from ppo.data.streaming import training_dataset  # noqa: E402


def build_datasets(data_args, training_args, tokenizer, attempt):
    """`(train, eval or None, eval prompts or None)`, each built through `attempt`
    (`StartupPass.attempt`): every data problem is found before the model loads."""
    data_kwargs = data_args.dataset_kwargs(tokenizer, training_args.seed)
    supervised = dict(max_length=data_args.max_length, truncate_prompt_to=data_args.truncate_prompt_len, **data_kwargs)
    train = attempt(training_dataset, SupervisedDataset, split_specs(data_args.train_datasets), data_args.lazy, **supervised)
    eval_specs = split_specs(data_args.eval_datasets)
    evaluation = attempt(SupervisedDataset, eval_specs, **supervised) if eval_specs else None
    prompts = None
    if eval_specs and training_args.eval_with_do_generation:
        prompts = attempt(PromptOnlyDataset, eval_specs, max_prompt_len=data_args.max_length, **data_kwargs)
    return train, evaluation, prompts


def start_up(argv):
    """Arguments, tokenizer, datasets and the model's embedding and positions, checked before the
    model loads; one error lists every problem."""
    startup = StartupPass()
    model_args, data_args, training_args = startup.parse((ModelArgument, DataArgument, SFTTrainingArguments), argv,
                                                         validate_arguments)
    tokenizer = startup.attempt(load_tokenizer, model_args.model_name_or_path)
    datasets = None
    if tokenizer is not None:
        datasets = build_datasets(data_args, training_args, tokenizer, startup.attempt)
        startup.add(token_and_position_problems(tokenizer, [("model_name_or_path", model_args.model_name_or_path)],
                                                data_args.max_length, "max_length"))
    startup.finish()
    return model_args, data_args, training_args, tokenizer, datasets


def main(argv=None):
    model_args, data_args, training_args, tokenizer, (train_dataset, eval_dataset, eval_prompts) = start_up(argv)
    acquire_output_dir(training_args.output_dir)  # one run per output_dir
    save_resolved_arguments(training_args.output_dir, model_args, data_args, training_args)
    set_seed(training_args.seed)  # fresh LoRA adapters and score heads start from the run's seed (PaddleNLP's llm scripts)

    overrides = load_overrides(model_args, training_args, pipeline_entry="sft")
    layout = trainer_strategy(training_args)  # pipeline: this rank's stages with the SFT loss; experts: this rank's
    layout.log_settings()
    model = layout.load_causal_lm(model_args.model_name_or_path, **overrides)
    if model_args.use_lora:
        model = apply_lora(model, base_model_name_or_path=model_args.model_name_or_path, **model_args.lora_settings())
    model = layout.place(model)
    trainer = SFTTrainer(
        model=model,
        trainer_layout=layout,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=train_dataset.get_collator(packed_length=data_args.max_length if data_args.zero_padding else None),
        tokenizer=tokenizer,
        callbacks=[TrackerCallback(training_args.output_dir, loss_name="loss/sft")],
        eval_prompt_dataset=eval_prompts,
        eval_max_new_tokens=training_args.eval_new_tokens(),
        eval_long_answer_len=data_args.eval_long_answer_len,
        use_rollout_engine=training_args.use_fusemt,
    )
    finish_trainer_run(trainer, training_args, tokenizer)


if __name__ == "__main__":
    run_and_exit(main)
