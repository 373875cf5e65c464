"""Arguments of `rm/run_reward.py` (reward-model training, full or LoRA).

Defaults live here only; every field has a help. `validate_arguments` is the entry point's
start-up pass (see `ppo.common.validation`), run by `parse_arguments` before any model loads.
"""
from dataclasses import dataclass, field
from typing import Optional

from ppo.common.argument_groups import (
    DatasetArguments,
    DivergenceArguments,
    ModelCommonArguments,
    PaddleNLPTrainingArguments,
    ZeroPaddingArguments,
)
from ppo.common.argument_problems import problem_scope
from ppo.common.trainer_entry_checks import trainer_entry_problems
from rm.reward_trainer import LOSS_TYPES


@dataclass
class ModelArgument(ModelCommonArguments):
    model_name_or_path: str = field(default=None, metadata={"help": "Local causal-LM or score-model directory to start from."})
    normalize_score_during_training: bool = field(
        default=False, metadata={"help": "Normalise scores with the running statistics while training."}
    )
    normalizer_type: Optional[str] = field(
        default=None, metadata={"help": "Score normaliser: RunningMeanStd | ExponentialMovingAverage | None."}
    )
    normalizer_momentum: float = field(default=0.9, metadata={"help": "Momentum of the ExponentialMovingAverage normaliser."})


@dataclass
class DataArgument(ZeroPaddingArguments, DatasetArguments):
    pass


@dataclass
class RewardTrainingArguments(DivergenceArguments, PaddleNLPTrainingArguments):
    loss_type: str = field(default="sequence-wise", metadata={"help": f"Pairwise loss: {' | '.join(LOSS_TYPES)}."})
    regularization: float = field(default=0.0, metadata={"help": "Weight of the squared-score regulariser."})

    def __post_init__(self):
        with problem_scope() as problems:
            super().__post_init__()
            if self.loss_type not in LOSS_TYPES:
                problems.append(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")


def validate_arguments(model_args, data_args, training_args):
    """Every problem of a reward-model run that needs several argument groups or the file system."""
    problems = trainer_entry_problems(model_args, data_args, training_args, [("model_name_or_path", model_args.model_name_or_path)])
    return problems + packing_problems(data_args, training_args)


def packing_problems(data_args, training_args):
    """`zero_padding` with the token-wise loss, which reads scores at the shorter answer's padding."""
    if data_args.zero_padding and training_args.loss_type == "token-wise":
        return ["zero_padding with loss_type token-wise: the token-wise loss reads the shorter answer's scores at its "
                "padding positions up to the longer answer's end (as safe-rlhf does), which packed rows do not compute; "
                "set loss_type sequence-wise or zero_padding false"]
    return []
