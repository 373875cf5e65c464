"""The preference-loss family (`ppo.algos.PREFERENCE_LOSSES`: DPO, cDPO, IPO, hinge, SimPO, ORPO,
CPO, R-DPO, KTO, kto_pair, sppo_hard, nca_pair, dpop on pairs; RRHF, LiPO-lambda, PRO, DRO on
ranked lists; unpaired KTO and BCO; NPO on rejected answers), full or LoRA, from a JSON or YAML argument file.

    python -m paddle.distributed.launch dpo/run_dpo.py config/tiny/dpo_argument.json [--flag value ...]

Trains on the data kind the loss names (`ppo.data.PREFERENCE_DATASETS`); data of another kind
is refused, naming the loss, before any model loads. The reference model is a frozen copy of
`ref_model_name_or_path` (default: `model_name_or_path`), or, with `use_lora`, the policy with
its adapter disabled; losses without one (and `reference_free`) load none.
Writes the model (or adapter) to `output_dir` with `metrics.jsonl`, `summary.json`,
`resolved_arguments.json` and VisualDL logs under `logging_dir`.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("dpo")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    from dpo.dpo_arguments import DataArgument, DPOTrainingArguments, ModelArgument, validate_arguments  # noqa: E402, F401
    from dpo.dpo_trainer import DPOTrainer, KTOCollator, UnpairedKTOCollator  # noqa: E402
    from dpo.preference_objective import needs_reference  # noqa: E402
    from ppo.algos import DATA_KINDS, get_preference_loss  # noqa: E402
    from ppo.entry.argument_groups import split_specs  # noqa: E402
    from ppo.common.argument_parsing import save_resolved_arguments  # noqa: E402
    from ppo.common.output_lock import acquire_output_dir  # noqa: E402
    from ppo.common.startup_checks import StartupPass, token_and_position_problems  # noqa: E402
    from ppo.common.process_exit import run_and_exit  # noqa: E402
    from paddlenlp.trainer.trainer_utils import set_seed  # noqa: E402
    from ppo.entry.run_setup import finish_trainer_run  # noqa: E402
    from ppo.entry.trainer_callbacks import TrackerCallback  # noqa: E402
    from ppo.data import PREFERENCE_DATASETS, PromptOnlyDataset  # noqa: E402
    from ppo.data.base import DataError  # noqa: E402
    from ppo.data.streaming import training_dataset  # noqa: E402
    from ppo.models.loading import apply_lora, load_overrides, load_tokenizer, set_dropout_off  # noqa: E402
    from ppo.strategy import trainer_strategy  # noqa: E402


def load_models(layout, model_args, training_args, overrides):
    """The policy (its dropout off; with `use_lora` an adapter in `model_name_or_path` merged and a
    fresh one applied, as TRL does) and the frozen reference (None when the loss needs none, or a
    LoRA policy's disabled adapter serves as one), in the run's `layout`
    (`ppo.strategy.trainer_strategy`: under pipeline parallelism this rank's stages, the policy's
    loss set by `DPOTrainer`)."""
    path = model_args.model_name_or_path
    model = layout.load_preference_policy(path, merge_adapter=model_args.use_lora, **overrides)
    if model_args.use_lora:
        model = apply_lora(model, base_model_name_or_path=path, **model_args.lora_settings())
    set_dropout_off(model)
    if not needs_reference(training_args.loss_type, training_args.reference_free):
        return model, None
    return model, layout.load_preference_reference(model, path, model_args.ref_model_name_or_path, **overrides)


KL_COLLATORS = {"pairs": KTOCollator, "unpaired": UnpairedKTOCollator}
"""The collator adding KTO's mismatched pairs, per data kind (for losses with the `kl_point` fact)."""


def loss_kind_dataset(loss, dataset_class, specs, kwargs, lazy=False):
    """`dataset_class(specs, **kwargs)` (streamed with `lazy`); data of another kind raises
    DataError naming the loss."""
    try:
        return training_dataset(dataset_class, specs, lazy, **kwargs)
    except ValueError as e:
        raise DataError(f"loss_type {loss.name!r} trains on {loss.data} ({DATA_KINDS[loss.data]}): {e}") from e


def build_preference_datasets(data_args, training_args, tokenizer, attempt=None):
    """`(train, eval or None, collator)` of the loss's data kind; data of another kind raises
    DataError naming the loss (before any model loads). `attempt` (`StartupPass.attempt`) builds
    each dataset, so that a problem in one still lets the other be checked (train None then)."""
    attempt = attempt or (lambda build, *args: build(*args))
    loss = get_preference_loss(training_args.loss_type)
    dataset_class = PREFERENCE_DATASETS[loss.data]
    kwargs = dict(max_length=data_args.max_length, truncate_prompt_to=data_args.truncate_prompt_len,
                  **data_args.dataset_kwargs(tokenizer, training_args.seed))
    train, evaluation = [attempt(loss_kind_dataset, loss, dataset_class, specs, kwargs, lazy) if specs else None
                         for specs, lazy in ((split_specs(data_args.train_datasets), data_args.lazy),
                                             (split_specs(data_args.eval_datasets), False))]
    if train is None:
        return None, evaluation, None
    collator = train.get_collator()
    if loss.kl_point:
        collator = KL_COLLATORS[loss.data](collator, max_length=data_args.max_length)
    return train, evaluation, collator


def start_up(argv, training_arguments):
    """Arguments, tokenizer, the datasets of the loss's kind, the generation-eval prompts and the
    models' embedding and positions, checked before any model loads; one error lists every
    problem. Returns `(model_args, data_args, training_args, tokenizer, datasets, eval_prompts)`."""
    startup = StartupPass()
    model_args, data_args, training_args = startup.parse((ModelArgument, DataArgument, training_arguments), argv,
                                                         validate_arguments)
    tokenizer = startup.attempt(load_tokenizer, model_args.model_name_or_path)
    datasets = eval_prompts = None
    if tokenizer is not None:
        datasets = startup.attempt(build_preference_datasets, data_args, training_args, tokenizer, startup.attempt)
        gen_specs = split_specs(data_args.eval_generation_datasets)
        if gen_specs and training_args.eval_with_do_generation:
            eval_prompts = startup.attempt(PromptOnlyDataset, gen_specs, max_prompt_len=data_args.max_length,
                                           **data_args.dataset_kwargs(tokenizer, training_args.seed))
        models = [(n, getattr(model_args, n)) for n in ("model_name_or_path", "ref_model_name_or_path")]
        startup.add(token_and_position_problems(tokenizer, models, data_args.max_length, "max_length"))
    startup.finish()
    return model_args, data_args, training_args, tokenizer, datasets, eval_prompts


def build_trainer(model_args, data_args, training_args, tokenizer, datasets, eval_prompts):
    """Models and the `DPOTrainer` for arguments, tokenizer and datasets that passed `start_up`."""
    train_dataset, eval_dataset, collator = datasets
    layout = trainer_strategy(training_args)
    layout.log_settings()
    model, ref_model = load_models(layout, model_args, training_args, load_overrides(model_args, training_args, pipeline_entry="dpo"))
    return DPOTrainer(
        model=model,
        ref_model=ref_model,
        trainer_layout=layout,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        tokenizer=tokenizer,
        callbacks=[TrackerCallback(training_args.output_dir, loss_name="loss/total")],
        eval_prompt_dataset=eval_prompts,
        eval_max_new_tokens=training_args.eval_new_tokens(),
        eval_long_answer_len=data_args.eval_long_answer_len,
        use_rollout_engine=training_args.use_fusemt,
        packed_length=data_args.max_length if data_args.zero_padding else None,
    )


def main(argv=None, training_arguments=None):
    """Parse `argv` (default `sys.argv[1:]`) and train; `training_arguments` replaces
    `DPOTrainingArguments` (e.g. `dpo/run_kto.py`'s, whose `loss_type` defaults to kto)."""
    model_args, data_args, training_args, tokenizer, datasets, eval_prompts = start_up(
        argv, training_arguments or DPOTrainingArguments)
    acquire_output_dir(training_args.output_dir)  # one run per output_dir
    save_resolved_arguments(training_args.output_dir, model_args, data_args, training_args)
    set_seed(training_args.seed)  # fresh LoRA adapters and score heads start from the run's seed (PaddleNLP's llm scripts)
    trainer = build_trainer(model_args, data_args, training_args, tokenizer, datasets, eval_prompts)
    return finish_trainer_run(trainer, training_args, trainer.tokenizer)


if __name__ == "__main__":
    run_and_exit(main)
