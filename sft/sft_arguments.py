"""Arguments of `sft/run_sft.py` (supervised fine-tuning, full or LoRA).

Defaults live here only; every field has a help. `validate_arguments` is the entry point's
start-up pass (see `ppo.common.validation`), run by `parse_arguments` before any model loads.
"""
from dataclasses import dataclass, field
from typing import ClassVar

from ppo.entry.argument_groups import (
    BenchmarkArguments,
    DatasetArguments,
    DivergenceArguments,
    EvalGenerationArguments,
    LogprobArguments,
    ModelCommonArguments,
    PaddleNLPTrainingArguments,
    PromptTruncationArguments,
    StreamingArguments,
    ZeroPaddingArguments,
)
from ppo.entry.trainer_entry_checks import trainer_entry_problems


@dataclass
class ModelArgument(ModelCommonArguments):
    model_name_or_path: str = field(default=None, metadata={"help": "Local model directory (or LoRA adapter) to fine-tune."})


@dataclass
class DataArgument(StreamingArguments, ZeroPaddingArguments, PromptTruncationArguments, DatasetArguments):
    pass


@dataclass
class SFTTrainingArguments(BenchmarkArguments, DivergenceArguments, LogprobArguments, EvalGenerationArguments,
                           PaddleNLPTrainingArguments):
    runs_expert_parallel: ClassVar[bool] = True  # expert_parallel_degree (ppo.strategy.expert)


def validate_arguments(model_args, data_args, training_args):
    """Every problem of an SFT run that needs several argument groups or the file system."""
    return trainer_entry_problems(model_args, data_args, training_args, [("model_name_or_path", model_args.model_name_or_path)])
