"""On-policy distillation (GKD; full or LoRA student, data parallel) from a flat JSON argument file.

    python -m paddle.distributed.launch sft/run_distill.py config/tiny/distill_argument.json [--flag value ...]

The student (`model_name_or_path`) samples answers to the dataset's prompts with the rollout
engine on a fraction `lmbda` of the steps (the dataset's answers on the others); the teacher
(`teacher_model_name_or_path`, same tokenizer, may be larger) scores every answer token, and the
loss is the generalised JSD of their next-token distributions (`beta`). Writes the student (or its
adapter) to `output_dir` with `metrics.jsonl` (`distill/jsd`, `distill/teacher_logprob`,
`distill/on_policy_frac`, ...), `summary.json`, `resolved_arguments.json` and VisualDL logs.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("distill")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    from paddlenlp.trainer.trainer_utils import set_seed  # noqa: E402
    from ppo.entry.argument_groups import split_specs  # noqa: E402
    from ppo.common.argument_parsing import save_resolved_arguments  # noqa: E402
    from ppo.common.output_lock import acquire_output_dir  # noqa: E402
    from ppo.common.process_exit import run_and_exit  # noqa: E402
    from ppo.entry.run_setup import finish_trainer_run  # noqa: E402
    from ppo.common.startup_checks import StartupPass, token_and_position_problems  # noqa: E402
    from ppo.entry.trainer_callbacks import TrackerCallback  # noqa: E402
    from ppo.data import PromptOnlyDataset, SupervisedDataset  # noqa: E402
    from ppo.models.loading import apply_lora, load_causal_lm, load_overrides, load_tokenizer, set_dropout_off  # noqa: E402
    from ppo.rollout import RolloutEngine  # noqa: E402
    from sft.distill_arguments import (  # noqa: E402
        DataArgument,
        DistillTrainingArguments,
        ModelArgument,
        tokenizer_problems,
        validate_arguments,
        vocabulary_problems,
    )
    from sft.distill_objective import TeacherScorer  # noqa: E402
    from sft.distill_sampling import StudentSampler  # noqa: E402
    from sft.distill_trainer import DistillTrainer  # noqa: E402


def build_datasets(data_args, training_args, tokenizer, attempt):
    """`(train, eval or None, eval prompts or None)`: the dataset's prompts and answers (the
    answers train the off-policy steps), each built through `attempt`."""
    data_kwargs = data_args.dataset_kwargs(tokenizer, training_args.seed)
    supervised = dict(max_length=data_args.max_length, truncate_prompt_to=data_args.truncate_prompt_len, **data_kwargs)
    train = attempt(SupervisedDataset, split_specs(data_args.train_datasets), **supervised)
    eval_specs = split_specs(data_args.eval_datasets)
    evaluation = attempt(SupervisedDataset, eval_specs, **supervised) if eval_specs else None
    prompts = None
    if eval_specs and training_args.eval_with_do_generation:
        prompts = attempt(PromptOnlyDataset, eval_specs, max_prompt_len=data_args.max_length, **data_kwargs)
    return train, evaluation, prompts


def start_up(argv):
    """Arguments, both tokenizers (the same one, or the run is refused naming them), datasets and
    the models' vocabularies and positions, checked before any model loads; one error lists all."""
    startup = StartupPass()
    model_args, data_args, training_args = startup.parse((ModelArgument, DataArgument, DistillTrainingArguments), argv,
                                                         validate_arguments)
    student_path, teacher_path = model_args.model_name_or_path, model_args.teacher_model_name_or_path
    tokenizer = startup.attempt(load_tokenizer, student_path)
    teacher_tokenizer = startup.attempt(load_tokenizer, teacher_path) if teacher_path else None
    datasets = None
    if tokenizer is not None and teacher_tokenizer is not None:
        mismatch = tokenizer_problems(tokenizer, teacher_tokenizer, student_path, teacher_path)
        startup.add([mismatch])  # its consequences (vocab_size, the teacher's embedding rows) are not repeated
        if mismatch is None:
            startup.add(vocabulary_problems(student_path, teacher_path))
        datasets = build_datasets(data_args, training_args, tokenizer, startup.attempt)
        dirs = [("model_name_or_path", student_path)] + [("teacher_model_name_or_path", teacher_path)] * (mismatch is None)
        length = data_args.max_length + training_args.max_dec_len
        startup.add(token_and_position_problems(tokenizer, dirs, length, "max_length + max_dec_len"))
    startup.finish()
    return model_args, data_args, training_args, tokenizer, datasets


def load_models(model_args, training_args):
    """`(student, teacher)`: the student with a fresh LoRA adapter when `use_lora`; dropout off in both."""
    overrides = load_overrides(model_args, training_args)
    student = load_causal_lm(model_args.model_name_or_path, **overrides)
    teacher = load_causal_lm(model_args.teacher_model_name_or_path, **overrides)
    for model in (student, teacher):
        set_dropout_off(model)
    if model_args.use_lora:
        student = apply_lora(student, base_model_name_or_path=model_args.model_name_or_path, **model_args.lora_settings())
    return student, teacher


def main(argv=None):
    model_args, data_args, training_args, tokenizer, (train_dataset, eval_dataset, eval_prompts) = start_up(argv)
    acquire_output_dir(training_args.output_dir)  # one run per output_dir
    save_resolved_arguments(training_args.output_dir, model_args, data_args, training_args)
    set_seed(training_args.seed)
    student, teacher = load_models(model_args, training_args)
    engine = RolloutEngine(student, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                           use_rollout_engine=training_args.use_fusemt)
    trainer = DistillTrainer(
        model=student,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=train_dataset.get_collator(),
        tokenizer=tokenizer,
        callbacks=[TrackerCallback(training_args.output_dir, loss_name="loss/distill")],
        eval_prompt_dataset=eval_prompts,
        eval_max_new_tokens=training_args.eval_new_tokens(),
        eval_long_answer_len=data_args.eval_long_answer_len,
        use_rollout_engine=training_args.use_fusemt,
        teacher=TeacherScorer(teacher, training_args.teacher_top_k, training_args.temperature,
                              training_args.logprob_chunk_size),
        sampler=StudentSampler(engine, training_args, tokenizer.pad_token_id),
    )
    finish_trainer_run(trainer, training_args, tokenizer)


if __name__ == "__main__":
    run_and_exit(main)
