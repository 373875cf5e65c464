"""Arguments of `dpo/run_dpo.py` (the DPO family, full or LoRA) and `dpo/run_kto.py`.

Defaults live here only; every field has a help. `validate_arguments` is the entry point's
start-up pass (see `ppo.common.validation`), run by `parse_arguments` before any model loads.
"""
from dataclasses import dataclass, field
from typing import List, Optional

import logging

from dpo.dpo_trainer import LOSS_TYPES
from dpo.preference_objective import loss_argument_problems, unused_hyperparameters
from ppo.common.argument_groups import (
    DatasetArguments,
    DivergenceArguments,
    EvalGenerationArguments,
    LogprobArguments,
    ModelCommonArguments,
    PaddleNLPTrainingArguments,
    PromptTruncationArguments,
    ZeroPaddingArguments,
)
from ppo.common.argument_problems import problem_scope
from ppo.common.trainer_entry_checks import trainer_entry_problems

logger = logging.getLogger(__name__)


@dataclass
class ModelArgument(ModelCommonArguments):
    model_name_or_path: str = field(default=None, metadata={"help": "Local model directory (or LoRA adapter) to align."})
    ref_model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "Reference model directory; default model_name_or_path (a LoRA policy: itself, adapter off)."},
    )


@dataclass
class DataArgument(ZeroPaddingArguments, PromptTruncationArguments, DatasetArguments):
    eval_generation_datasets: List[str] = field(
        default_factory=list,
        metadata={"help": "Prompt datasets with reference answers (e.g. Jsonfile with tgt) for greedy exact-match evaluation."},
    )


@dataclass
class DPOTrainingArguments(DivergenceArguments, LogprobArguments, EvalGenerationArguments, PaddleNLPTrainingArguments):
    loss_type: str = field(
        default="sigmoid", metadata={"help": f"Preference loss (the table in docs/algorithms.md): {' | '.join(LOSS_TYPES)}."}
    )
    beta: float = field(
        default=0.1, metadata={"help": "Inverse temperature of the implicit reward (ORPO: the weight lambda of the odds-ratio term)."}
    )
    label_smoothing: float = field(
        default=0.0, metadata={"help": "cDPO / robust SimPO: assumed probability that a preference label is flipped, in [0, 0.5)."}
    )
    simpo_gamma: float = field(default=0.5, metadata={"help": "SimPO target reward margin gamma."})
    sft_loss_ratio: float = field(
        default=0.0, metadata={"help": "Weight of the NLL of the chosen answers (token mean) added to the preference loss."}
    )
    pref_loss_ratio: float = field(
        default=1.0, metadata={"help": "Weight of the preference loss (PaddleNLP: loss = pref_loss_ratio * pref + sft_loss_ratio * NLL)."}
    )
    dpop_lambda: float = field(default=50.0, metadata={"help": "dpop: weight of the penalty max(0, ref_c - pi_c) (PaddleNLP default 50)."})
    rdpo_alpha: float = field(
        default=0.01, metadata={"help": "rdpo: alpha in -log s(beta h + alpha (|y_chosen| - |y_rejected|)), lengths in tokens."}
    )
    reference_free: bool = field(
        default=False, metadata={"help": "sigmoid/ipo/hinge against a uniform reference (log-probs 0): no reference model."}
    )
    desirable_weight: float = field(default=1.0, metadata={"help": "KTO weight of the desirable (chosen) examples."})
    undesirable_weight: float = field(default=1.0, metadata={"help": "KTO weight of the undesirable (rejected) examples."})

    def __post_init__(self):
        with problem_scope() as problems:
            super().__post_init__()
            problems += self.preference_loss_problems()

    def preference_loss_problems(self):
        """The loss type exists, its hyperparameters and reference settings fit its registry facts
        (`dpo.preference_objective.loss_argument_problems`), and the weights are in range; a
        hyperparameter of another loss set away from its default is logged as unused."""
        problems = loss_argument_problems(self)
        if self.beta <= 0:
            problems.append(f"beta must be positive, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            problems.append(f"label_smoothing must lie in [0, 0.5), got {self.label_smoothing}")
        if self.pref_loss_ratio < 0:
            problems.append(f"pref_loss_ratio must be >= 0, got {self.pref_loss_ratio}")
        if self.sft_loss_ratio < 0:
            problems.append(f"sft_loss_ratio must be >= 0, got {self.sft_loss_ratio}")
        if self.pref_loss_ratio == 0 and self.sft_loss_ratio == 0:
            problems.append("pref_loss_ratio and sft_loss_ratio are both 0: nothing to train")
        if not problems:
            unused = unused_hyperparameters(self)
            if unused:
                logger.warning(f"loss_type {self.loss_type!r} does not use {', '.join(unused)} (set away from the default): ignored")
        return problems


def validate_arguments(model_args, data_args, training_args):
    """Every problem of a DPO-family run that needs several argument groups or the file system."""
    model_dirs = [(n, getattr(model_args, n)) for n in ("model_name_or_path", "ref_model_name_or_path")]
    return trainer_entry_problems(model_args, data_args, training_args, model_dirs)
