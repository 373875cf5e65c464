"""Online (iterative) DPO from a flat JSON argument file.

    python dpo/run_online_dpo.py config/tiny/online_dpo_argument.json [--flag value ...]

Each round samples `rollout_n` answers per prompt from the current policy, ranks them
with the reward model (`reward_model_name_or_path`), the reward server (`use_rm_server`)
or rule scorers (`use_rule_reward`), as `run_ppo.py` chooses, or by a generative judge's
pairwise verdicts (`judge_model`: a model directory, or `policy` for self-rewarding), and
trains on the pairs with the DPO-family loss. Writes `output_dir/policy` (PaddleNLP layout),
`checkpoint-<round>/` for resume, `metrics.jsonl`, `samples.jsonl`, `summary.json`,
`resolved_arguments.json` and VisualDL logs.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import logging  # noqa: E402

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("online-dpo")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    import paddle  # noqa: E402
    from dpo.online_dpo_arguments import DataArgument, ModelArgument, OnlineDPOTrainingArguments, validate_arguments  # noqa: E402
    from dpo.online_dpo_trainer import build_online_dpo_trainer, without_unused_reference  # noqa: E402
    from ppo.entry.argument_groups import split_specs  # noqa: E402
    from ppo.common.argument_parsing import save_resolved_arguments  # noqa: E402
    from ppo.common.startup_checks import StartupPass  # noqa: E402
    from ppo.models.reward_tokens import embedding_limit_problems  # noqa: E402
    from ppo.serving.reward_client import run_server_problems  # noqa: E402
    from ppo.common.process_exit import run_and_exit  # noqa: E402
    from ppo.data import PromptOnlyDataset  # noqa: E402
    from ppo.models.loading import enable_recompute, load_overrides, load_tokenizer, training_dtype  # noqa: E402
    from ppo.models.ppo_models import build_ppo_models  # noqa: E402
    from ppo.trainer.scoring import score_sources  # noqa: E402
    from dpo.pair_choice import build_judge, judge_word_problems  # noqa: E402

logger = logging.getLogger("dpo.online")


def build_datasets(data_args, training_args, tokenizer, require_label, attempt=None):
    """Train prompts (each with its reference answer when a server or rule scores against it)
    and eval prompts, each built through `attempt` (`StartupPass.attempt`)."""
    attempt = attempt or (lambda build, *args, **kwargs: build(*args, **kwargs))
    common = dict(data_args.dataset_kwargs(tokenizer, training_args.seed), **data_args.prompt_field_keys())
    train = attempt(PromptOnlyDataset, split_specs(data_args.train_datasets), max_prompt_len=data_args.max_prompt_len,
                    require_label=require_label, **common)
    eval_specs = split_specs(data_args.eval_datasets)
    evaluation = attempt(PromptOnlyDataset, eval_specs, max_prompt_len=data_args.max_prompt_len, **common) if eval_specs else None
    return train, evaluation


def start_up(argv):
    """Arguments, tokenizer, prompts, the models' embedding and positions and the reward server,
    checked before any model loads; one error lists every problem."""
    startup = StartupPass()
    model_args, data_args, training_args = startup.parse((ModelArgument, DataArgument, OnlineDPOTrainingArguments), argv,
                                                         validate_arguments)
    tokenizer = startup.attempt(load_tokenizer, model_args.actor_model_name_or_path)
    datasets = None
    if tokenizer is not None:
        external = model_args.use_rm_server or model_args.use_rule_reward
        needs_reference = model_args.judge_model and "{reference}" in judge_texts(model_args)
        datasets = build_datasets(data_args, training_args, tokenizer, bool(external or needs_reference), startup.attempt)
        startup.add(judge_word_problems(model_args, tokenizer))
        startup.add(embedding_limit_problems(model_args, False, tokenizer, None,
                                             data_args.max_prompt_len + training_args.max_dec_len))
    startup.add(run_server_problems(model_args))
    startup.finish()
    return model_args, data_args, training_args, tokenizer, datasets


def judge_texts(model_args):
    """The judge's two rubric texts, joined (the fields were checked with the arguments)."""
    from ppo.judge.templates import template_text

    return template_text(model_args.judge_template) + template_text(model_args.judge_pair_template)


def build_trainer(argv=None):
    """Parse arguments, check them, load data and models; returns the run's ready
    `ppo.trainer.loop.OnlineLoop`."""
    model_args, data_args, training_args, tokenizer, (train, evaluation) = start_up(argv)
    save_resolved_arguments(training_args.output_dir, model_args, data_args, training_args)
    paddle.seed(training_args.seed)
    models = build_ppo_models(model_args, use_critic=False, dtype=training_dtype(training_args),
                              **load_overrides(model_args, training_args))
    models = without_unused_reference(models, training_args)  # SimPO / ORPO: the copy is not needed
    if training_args.recompute:
        enable_recompute(models.actor, model_args.recompute_granularity, model_args.recompute_use_reentrant)
    client, rule_scorer = score_sources(model_args)
    judge = build_judge(model_args, models.actor, tokenizer, training_args.use_fusemt)
    return build_online_dpo_trainer(training_args, models, tokenizer, train, evaluation, reward_client=client,
                                    rule_scorer=rule_scorer, eval_long_answer_len=data_args.eval_long_answer_len,
                                    judge=judge)


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s %(levelname)s: %(message)s")
    trainer = build_trainer(argv)
    summary = trainer.train()
    print(trainer.closing_text(summary), flush=True)
    return summary


if __name__ == "__main__":
    run_and_exit(main)
