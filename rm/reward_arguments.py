"""Arguments of `rm/run_reward.py` (reward-model training, full or LoRA).

Defaults live here only; every field has a help. `validate_arguments` is the entry point's
start-up pass (see `ppo.common.validation`), run by `parse_arguments` before any model loads.
"""
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ppo.entry.argument_groups import (
    BenchmarkArguments,
    DatasetArguments,
    DivergenceArguments,
    ModelCommonArguments,
    PaddleNLPTrainingArguments,
    PromptTruncationArguments,
    StreamingArguments,
    ZeroPaddingArguments,
)
from ppo.entry.trainer_entry_checks import trainer_entry_problems
from ppo.data.process_reward import PLACEHOLDER_TOKEN, REWARD_TOKENS
from ppo.data.specs import dataset_names  # noqa: F401  (tests/test_configs.py reads it from here)
from rm.process_reward_checks import process_reward_problems
from rm.reward_trainer import LOSS_TYPES

TRAINED_SCORE_TYPES = ("reward", "cost")
"""What rm/run_reward.py can train: a reward model (`better`) or a Safe RLHF cost model (`safer` + safety signs)."""


@dataclass
class ModelArgument(ModelCommonArguments):
    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"score_type": "rm.reward_arguments:TRAINED_SCORE_TYPES"}
    model_name_or_path: str = field(default=None, metadata={"help": "Local causal-LM or score-model directory to start from."})
    score_type: str = field(
        default="reward",
        metadata={"help": "What the score model learns (saved as its config's score_type): reward (pairwise preference "
                  "on `better`, PreferenceDataset) | cost (Safe RLHF cost model: `safer` pairs plus safety signs, "
                  "SafetyPreferenceDataset; higher = less safe, > 0 = unsafe)."},
    )
    normalize_score_during_training: bool = field(
        default=False, metadata={"help": "Normalise scores with the running statistics while training."}
    )
    normalizer_type: Optional[str] = field(
        default=None, metadata={"help": "Score normaliser: RunningMeanStd | ExponentialMovingAverage | None."}
    )
    normalizer_momentum: float = field(default=0.9, metadata={"help": "Momentum of the ExponentialMovingAverage normaliser."})
    process_reward: bool = field(
        default=False,
        metadata={"help": "Train a process reward model (PaddleNLP's name): the score at each step's placeholder_token "
                  "learns whether the step is good, on step-labelled data (paddlenlp-prm, Math-Shepherd's format)."},
    )


@dataclass
class DataArgument(StreamingArguments, ZeroPaddingArguments, PromptTruncationArguments, DatasetArguments):
    placeholder_token: str = field(
        default=PLACEHOLDER_TOKEN,
        metadata={"help": "process_reward: the token after each step whose score is the step's score (Math-Shepherd's)."},
    )
    reward_tokens: str = field(
        default=REWARD_TOKENS, metadata={"help": "process_reward: the labels of a good and of a bad step in the data, comma-separated."}
    )


@dataclass
class RewardTrainingArguments(BenchmarkArguments, DivergenceArguments, PaddleNLPTrainingArguments):
    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"loss_type": "ppo.models.score_model:LOSS_TYPES"}
    loss_type: str = field(default="sequence-wise", metadata={"help": f"Pairwise loss: {' | '.join(LOSS_TYPES)}."})
    regularization: float = field(default=0.0, metadata={"help": "Weight of the squared-score regulariser."})

    def resolve_group(self):
        if self.loss_type not in LOSS_TYPES:
            return [f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}"]
        return []


def score_type_problems(model_args, data_args, training_args):
    """`score_type` known; a cost model needs safety labels in every dataset and a plain (not pipeline) model."""
    if model_args.score_type not in TRAINED_SCORE_TYPES:
        return [f"score_type must be one of {TRAINED_SCORE_TYPES}, got {model_args.score_type!r}"]
    if model_args.score_type != "cost":
        return []
    problems = []
    if training_args.pipeline_parallel_degree > 1:
        problems.append("score_type cost with pipeline_parallel_degree > 1: the cost loss is not implemented for "
                        "pipeline stages; train the cost model with data/sharding/tensor parallelism")
    for arg in ("train_datasets", "eval_datasets"):
        for name in dataset_names(getattr(data_args, arg)):
            if safety_labels_of(name) == "none":
                problems.append(
                    f"score_type cost trains on safety labels (safer_response_id, is_response_0_safe, is_response_1_safe), "
                    f"but {arg} dataset '{name}' has none: use PKU-SafeRLHF/safety (or /safety/test) files, 'json' "
                    f"records with safer, is_safe and is_other_safe, or a RawDataset subclass declaring SAFETY_LABELS"
                )
    return problems


def safety_labels_of(name):
    """The registered dataset's `SAFETY_LABELS` fact; None for an unknown name (reported when the data loads)."""
    from ppo.data import RawDataset, UnknownDatasetError  # the package registers every dataset

    try:
        return RawDataset.resolve(name).SAFETY_LABELS
    except UnknownDatasetError:
        return None


def validate_arguments(model_args, data_args, training_args):
    """Every problem of a reward-model run that needs several argument groups or the file system."""
    problems = trainer_entry_problems(model_args, data_args, training_args, [("model_name_or_path", model_args.model_name_or_path)])
    problems += score_type_problems(model_args, data_args, training_args)
    problems += process_reward_problems(model_args, data_args, training_args)
    return problems + packing_problems(data_args, training_args)


def packing_problems(data_args, training_args):
    """`zero_padding` with the token-wise loss, which reads scores at the shorter answer's padding."""
    if data_args.zero_padding and training_args.loss_type == "token-wise":
        return ["zero_padding with loss_type token-wise: the token-wise loss reads the shorter answer's scores at its "
                "padding positions up to the longer answer's end (as safe-rlhf does), which packed rows do not compute; "
                "set loss_type sequence-wise or zero_padding false"]
    return []
