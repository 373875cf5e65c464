"""Arguments of `sft/run_sft.py` (supervised fine-tuning, full or LoRA).

Defaults live here only; every field has a help. `validate_arguments` is the entry point's
start-up pass (see `ppo.common.validation`), run by `parse_arguments` before any model loads.
"""
from dataclasses import dataclass, field

from ppo.common.argument_groups import (
    DatasetArguments,
    DivergenceArguments,
    EvalGenerationArguments,
    LogprobArguments,
    ModelCommonArguments,
    PaddleNLPTrainingArguments,
    PromptTruncationArguments,
)
from ppo.common.trainer_entry_checks import trainer_entry_problems


@dataclass
class ModelArgument(ModelCommonArguments):
    model_name_or_path: str = field(default=None, metadata={"help": "Local model directory (or LoRA adapter) to fine-tune."})


@dataclass
class DataArgument(PromptTruncationArguments, DatasetArguments):
    zero_padding: bool = field(
        default=False,
        metadata={"help": "Pack each batch's samples into rows of at most max_length tokens (per-sample position ids, "
                  "block-diagonal causal mask): the same loss and gradients as padding, without the pad tokens' work "
                  "(PaddleNLP's name; not with pipeline parallel)."},
    )


@dataclass
class SFTTrainingArguments(DivergenceArguments, LogprobArguments, EvalGenerationArguments, PaddleNLPTrainingArguments):
    pass


def validate_arguments(model_args, data_args, training_args):
    """Every problem of an SFT run that needs several argument groups or the file system."""
    problems = trainer_entry_problems(model_args, data_args, training_args, [("model_name_or_path", model_args.model_name_or_path)])
    if data_args.zero_padding and training_args.pipeline_parallel_degree > 1:
        problems.append("zero_padding packs rows with a 4-D attention mask, which the pipeline stages do not take: "
                        "set zero_padding false or pipeline_parallel_degree 1")
    return problems
