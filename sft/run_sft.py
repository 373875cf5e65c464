"""Supervised fine-tuning (full or LoRA) from a flat JSON argument file.

    python -m paddle.distributed.launch sft/run_sft.py config/tiny/sft_argument.json [--flag value ...]

Writes the model (or adapter) to `output_dir` with `metrics.jsonl`, `summary.json`,
`resolved_arguments.json` and VisualDL logs under `logging_dir`. Merge a LoRA
run into a full model with `python sft/merge_lora.py --lora_path OUT --output_dir MERGED`.
"""
import os
import sys

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")  # before paddle: 3-4x faster matmuls on AVX2-only CPUs
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import dataclass, field  # noqa: E402
from typing import Optional  # noqa: E402

from paddlenlp.trainer import TrainingArguments  # noqa: E402

from ppo.common.args_common import DatasetArguments, DivergenceArguments, LogprobArguments, ModelCommonArguments, split_specs  # noqa: E402
from ppo.common.arguments import parse_arguments, save_resolved_arguments  # noqa: E402
from ppo.common.run_setup import finish_trainer_run  # noqa: E402
from ppo.common.validation import validate_run  # noqa: E402
from ppo.common.trainer_callbacks import TrackerCallback  # noqa: E402
from ppo.data import PromptOnlyDataset, SupervisedDataset  # noqa: E402
from ppo.models.loading import apply_lora, load_causal_lm, load_overrides, load_tokenizer  # noqa: E402
from ppo.models.pipeline import AnswerNLLCriterion, CausalLMPipelineInputs, check_pipeline_run, load_pipe  # noqa: E402
from sft.sft_trainer import SFTTrainer  # noqa: E402
from ppo.common.output_lock import acquire_output_dir  # noqa: E402
from ppo.common.startup_checks import check_token_and_position_limits  # noqa: E402
from ppo.common.process_exit import run_and_exit  # noqa: E402


@dataclass
class ModelArgument(ModelCommonArguments):
    model_name_or_path: str = field(default=None, metadata={"help": "Local model directory (or LoRA adapter) to fine-tune."})


@dataclass
class DataArgument(DatasetArguments):
    eval_max_new_tokens: int = field(default=32, metadata={"help": "Generation length for held-out exact-match evaluation."})
    max_prompt_len: Optional[int] = field(
        default=None, metadata={"help": "Prompts longer than this many tokens keep their last ones (PaddleNLP src_length); none: whole."}
    )


@dataclass
class SFTTrainingArguments(DivergenceArguments, LogprobArguments, TrainingArguments):
    eval_with_do_generation: bool = field(
        default=True, metadata={"help": "Also greedy-decode eval prompts and report exact-match accuracy."}
    )
    use_fusemt: bool = field(default=True, metadata={"help": "Use the fast rollout engine for evaluation generation."})


def main(argv=None):
    model_args, data_args, training_args = parse_arguments((ModelArgument, DataArgument, SFTTrainingArguments), argv)
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required")
    validate_run((model_args, data_args, training_args), model_dirs=[("model_name_or_path", model_args.model_name_or_path)])
    acquire_output_dir(training_args.output_dir)  # one run per output_dir
    save_resolved_arguments(training_args.output_dir, model_args, data_args, training_args)

    tokenizer = load_tokenizer(model_args.model_name_or_path)
    check_token_and_position_limits(
        tokenizer, [("model_name_or_path", model_args.model_name_or_path)], data_args.max_length, "max_length"
    )
    overrides = load_overrides(model_args, training_args, pipeline_entry="sft")
    if training_args.pipeline_parallel_degree > 1:
        check_pipeline_run(training_args, model_args.use_lora)
        model = load_pipe(
            model_args.model_name_or_path, AnswerNLLCriterion(), CausalLMPipelineInputs(training_args.gradient_accumulation_steps),
            **overrides,
        )
    else:
        model = load_causal_lm(model_args.model_name_or_path, **overrides)
    if model_args.use_lora:
        model = apply_lora(model, base_model_name_or_path=model_args.model_name_or_path, **model_args.lora_settings())
    data_kwargs = data_args.dataset_kwargs(tokenizer, training_args.seed)
    train_dataset = SupervisedDataset(
        split_specs(data_args.train_datasets), max_length=data_args.max_length, truncate_prompt_to=data_args.max_prompt_len, **data_kwargs
    )
    eval_specs = split_specs(data_args.eval_datasets)
    eval_dataset = (
        SupervisedDataset(eval_specs, max_length=data_args.max_length, truncate_prompt_to=data_args.max_prompt_len, **data_kwargs)
        if eval_specs
        else None
    )
    eval_prompts = None
    if eval_specs and training_args.eval_with_do_generation:
        eval_prompts = PromptOnlyDataset(eval_specs, max_prompt_len=data_args.max_length, **data_kwargs)

    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=train_dataset.get_collator(),
        tokenizer=tokenizer,
        callbacks=[TrackerCallback(training_args.output_dir, loss_name="loss/sft")],
        eval_prompt_dataset=eval_prompts,
        eval_max_new_tokens=data_args.eval_max_new_tokens,
        eval_long_answer_len=data_args.eval_long_answer_len,
        use_fusemt=training_args.use_fusemt,
    )
    finish_trainer_run(trainer, training_args, tokenizer)


if __name__ == "__main__":
    run_and_exit(main)
