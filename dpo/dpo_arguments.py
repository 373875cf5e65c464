"""Arguments of `dpo/run_dpo.py` (the DPO family, full or LoRA) and `dpo/run_kto.py`.

Defaults live here only; every field has a help. `validate_arguments` is the entry point's
start-up pass (see `ppo.common.validation`), run by `parse_arguments` before any model loads.
"""
from dataclasses import dataclass, field
from typing import ClassVar, List, Optional

from dpo.dpo_trainer import LOSS_TYPES
from dpo.preference_arguments import PreferenceLossArguments
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
    model_name_or_path: str = field(default=None, metadata={"help": "Local model directory (or LoRA adapter) to align."})
    ref_model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "Reference model directory; default model_name_or_path (a LoRA policy: itself, adapter off)."},
    )


@dataclass
class DataArgument(StreamingArguments, ZeroPaddingArguments, PromptTruncationArguments, DatasetArguments):
    eval_generation_datasets: List[str] = field(
        default_factory=list,
        metadata={"help": "Prompt datasets with reference answers (e.g. Jsonfile with tgt) for greedy exact-match evaluation."},
    )


@dataclass
class DPOTrainingArguments(BenchmarkArguments, PreferenceLossArguments, DivergenceArguments, LogprobArguments,
                           EvalGenerationArguments, PaddleNLPTrainingArguments):
    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"loss_type": "dpo.dpo_trainer:LOSS_TYPES"}
    loss_type: str = field(
        default="sigmoid", metadata={"help": f"Preference loss (the table in docs/algorithms.md): {' | '.join(LOSS_TYPES)}."}
    )

    def resolve_group(self):
        return self.preference_loss_problems()


def validate_arguments(model_args, data_args, training_args):
    """Every problem of a DPO-family run that needs several argument groups or the file system."""
    model_dirs = [(n, getattr(model_args, n)) for n in ("model_name_or_path", "ref_model_name_or_path")]
    return trainer_entry_problems(model_args, data_args, training_args, model_dirs)
