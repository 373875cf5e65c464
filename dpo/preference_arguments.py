"""The preference loss's arguments, declared once for the DPO trainer (`dpo/run_dpo.py`) and
online DPO (`dpo/run_online_dpo.py`): the registry's hyperparameters
(`ppo.algos.PREFERENCE_HYPERPARAMETERS`, PaddleNLP's and TRL's names) and the weights of the
preference and NLL terms, with the checks that read the chosen loss's registry facts."""
import logging
from dataclasses import dataclass, field

from .preference_objective import loss_argument_problems, unused_hyperparameters

logger = logging.getLogger(__name__)


@dataclass
class PreferenceLossArguments:
    """The hyperparameters of every preference loss (each loss reads its own, see
    `ppo.algos.PREFERENCE_LOSSES`) and the terms' weights."""

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
