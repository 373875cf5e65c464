"""The preference loss's arguments, for the DPO trainer (`dpo/run_dpo.py`) and online DPO
(`dpo/run_online_dpo.py`), generated from their declarations: the registry's hyperparameters
(`ppo.algos.PREFERENCE_SETTINGS`, PaddleNLP's and TRL's names) and the weights of the preference
and NLL terms (`dpo.preference_objective.WEIGHT_SETTINGS`). Each field's default, help and range
is its `ppo.algos.Setting`'s; the checks read the chosen loss's registry facts."""
import logging

from ppo.algos import PREFERENCE_LOSSES, PREFERENCE_SETTINGS
from ppo.common.registry_settings import in_range, range_text, settings_dataclass

from .preference_objective import WEIGHT_SETTINGS, loss_argument_problems, unused_hyperparameters

logger = logging.getLogger(__name__)

FIELD_ORDER = ("beta", "label_smoothing", "simpo_gamma", "sft_loss_ratio", "pref_loss_ratio", "dpop_lambda",
               "rdpo_alpha", "reference_free", "desirable_weight", "undesirable_weight")
"""The order of the fields in `--help` and the argument reference (that of earlier releases); a
setting declared later follows them."""


def preference_settings(hyperparameters=None, weights=None):
    """The `Setting`s of `PreferenceLossArguments` in field order: `hyperparameters` (default
    `PREFERENCE_SETTINGS`) and `weights` (default `WEIGHT_SETTINGS`), dicts name -> `Setting`."""
    declared = {**(PREFERENCE_SETTINGS if hyperparameters is None else hyperparameters),
                **(WEIGHT_SETTINGS if weights is None else weights)}
    return [declared[name] for name in FIELD_ORDER if name in declared] + \
        [s for name, s in declared.items() if name not in FIELD_ORDER]


def setting_origins(losses=None):
    """name -> `(module, owners)` of each setting (the stored argument table watches the module;
    the argument reference names the owners: the losses of `losses` that read a hyperparameter,
    or those that do not when they are fewer)."""
    losses = PREFERENCE_LOSSES if losses is None else losses
    origins = {}
    for name in PREFERENCE_SETTINGS:
        users = [e.name for e in losses.values() if name in e.hyperparameters]
        others = [e.name for e in losses.values() if name not in e.hyperparameters]
        owners = " / ".join(users) if len(users) <= len(others) else f"all but {' / '.join(others)}"
        origins[name] = ("ppo.algos.preference_registry", f"loss_type {owners}")
    origins.update({name: ("dpo.preference_objective", "the preference objective") for name in WEIGHT_SETTINGS})
    return origins


def range_problem(setting, value):
    """The DPO trainer's line for `value` outside `setting.bounds` (`beta must be positive, got -0.1`,
    `label_smoothing must lie in [0, 0.5), got 0.7`, `pref_loss_ratio must be >= 0, got -2`), else
    `setting.problem(value)` (its choices and check)."""
    bounds = setting.bounds
    if bounds is None or isinstance(value, bool) or not isinstance(value, (int, float)) or in_range(value, *bounds):
        return setting.problem(value)
    if bounds[2] is None:
        words = "be positive" if bounds[:2] == (0, False) else f"be {range_text(*bounds)}"
    else:
        words = f"lie {range_text(*bounds)}"
    return f"{setting.name} must {words}, got {value}"


class PreferenceLossChecks:
    """The checks of `PreferenceLossArguments` (its fields are generated from the declarations)."""

    # the ranges keep the DPO trainer's wording (`range_problem`): the stored table's early check leaves them here
    full_pass_ranges = tuple(s.name for s in preference_settings() if s.bounds)

    def preference_loss_problems(self):
        """The loss type exists, its hyperparameters and reference settings fit its registry facts
        (`dpo.preference_objective.loss_argument_problems`), and every value is one its declaration
        allows; a hyperparameter of another loss set away from its default is logged as unused."""
        problems = loss_argument_problems(self)
        problems += [p for s in preference_settings() for p in [range_problem(s, getattr(self, s.name))] if p]
        if self.pref_loss_ratio == 0 and self.sft_loss_ratio == 0:
            problems.append("pref_loss_ratio and sft_loss_ratio are both 0: nothing to train")
        if not problems:
            unused = unused_hyperparameters(self)
            if unused:
                logger.warning(f"loss_type {self.loss_type!r} does not use {', '.join(unused)} (set away from the default): ignored")
        return problems


PreferenceLossArguments = settings_dataclass(
    "PreferenceLossArguments", preference_settings(), (PreferenceLossChecks,), __name__,
    """The hyperparameters of every preference loss (each loss reads its own, see
    `ppo.algos.PREFERENCE_LOSSES`) and the terms' weights.""", origins=setting_origins())
