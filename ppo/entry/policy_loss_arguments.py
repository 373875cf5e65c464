"""PPO/GRPO's policy loss, its rollout correction and the advantage estimators' own settings.

`policy_loss` names an entry of `ppo.algos.POLICY_LOSSES`, or `module.path:NAME` of a
`ppo.algos.PolicyLoss` in a module of one's own. Each entry declares its own settings beside it
(`ppo.algos.Setting`: the PPO clip settings `clip_range_ratio*`, `dual_clip`,
`importance_sampling_level`, and each loss's own); `PolicyLossArguments` is generated from those
declarations (one field per setting), and an outside entry's settings are added when the argument
file names it (`PolicyLossOptions.with_outside_settings`), so they are keys of the argument file
too. `rollout_is*` turn the rollout engine's log-probs into importance weights on the policy loss
(`ppo.algos.rollout_correction`). `policy_loss_problems` refuses, before any model loads, a name
that is not registered, a setting value its declaration does not allow, and a setting that the
chosen loss, correction or estimator would not read. The advantage estimators' settings
(`ppo.algos.AdvEstimator`, e.g. `pass_k`, VAPO's `vapo_alpha`) are generated and checked the same way.
"""
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ..algos import ADV_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES, TOP_ENTROPY_NORMS, AdvEstimator, PolicyLoss
from ..algos.rollout_correction import ROLLOUT_IS_LEVELS, ROLLOUT_IS_THRESHOLD
from ..common.plugins import find_entry
from ..common.registry_settings import (collect_settings, setting_origins, setting_problems, settings_dataclass,
                                        with_settings)

LOSS_AGG_MODE_HELP = (
    f"Loss aggregation: {' | '.join(LOSS_AGG_MODES)}; None (not set): the policy loss's paper's (seq-mean-token-mean "
    "for gspo and gmpo, as verl; token-mean for the others) and token-mean for the value, entropy and KL terms. The "
    "start-up log names the one used and why."
)
"""The help of `loss_agg_mode` (declared with the update settings in `ppo/entry/ppo_arguments.py`)."""
POLICY_LOSS_SETTINGS = collect_settings(POLICY_LOSSES)
"""name -> `ppo.algos.Setting` of every registered policy loss's settings (generated fields)."""
ESTIMATOR_SETTINGS = collect_settings(ADV_ESTIMATORS)
"""name -> `ppo.algos.Setting` of every registered advantage estimator's settings (generated fields:
`pass_k`, `pass_k_threshold`, VAPO's `vapo_alpha`, `critic_gae_lambda`)."""


def find_policy_loss(name):
    """The `PolicyLoss` of `policy_loss`: a registered name, or `module.path:NAME` naming one in a
    module of one's own (imported here). ValueError when neither."""
    return find_entry(name, POLICY_LOSSES, PolicyLoss, "policy_loss")


@dataclass
class PolicyLossOptions:
    """The choice of policy loss and what acts with any of them; `PolicyLossArguments` adds the
    entries' own settings."""

    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"policy_loss": "ppo.algos.policy_registry:POLICY_LOSSES",
                                     "rollout_is": "ppo.algos.rollout_correction:ROLLOUT_IS_LEVELS"}
    # fields whose value may name an outside entry (module.path:NAME) that declares arguments of its own
    outside_entries: ClassVar[tuple] = ("policy_loss", "adv_estimator")
    policy_loss: str = field(
        default="ppo_clip",
        metadata={"help": f"Policy loss (ppo.algos.POLICY_LOSSES, docs/algorithms.md): {' | '.join(POLICY_LOSSES)} "
                  "| module.path:NAME of a ppo.algos.PolicyLoss of your own (its settings become arguments); "
                  "ppo_clip is PPO's clipped loss (GSPO too with importance_sampling_level sequence)."},
    )
    top_entropy_frac: float = field(
        default=1.0,
        metadata={"help": "Train only on this fraction of each micro-batch's response tokens, those of highest entropy "
                  "(Wang et al. 2025, 'Beyond the 80/20 Rule'; 0.2 there), with any policy_loss; 1.0: every token."},
    )
    top_entropy_norm: str = field(
        default=TOP_ENTROPY_NORMS[0],
        metadata={"help": "top_entropy_frac < 1: kept = the policy loss is divided by the kept tokens only (the Beyond the "
                  "80/20 authors' code, Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR) | all = by every response token, the "
                  "dropped ones included (TRL's GRPOTrainer)."},
    )
    rollout_is: str = field(
        default="none",
        metadata={"help": "Rollout correction: importance weights pi_train / pi_rollout on the policy loss from the engine's "
                  "log-probs and the training forward's, per token | sequence (their product) | none (the mismatch is "
                  "still reported as rollout/* when both exist). Needs use_rollout_logprobs false."},
    )
    rollout_is_threshold: Optional[float] = field(
        default=ROLLOUT_IS_THRESHOLD, metadata={"help": "TIS: weights above this are truncated to it (verl's default 2.0); None: no truncation."}
    )
    rollout_is_lower: Optional[float] = field(
        default=None, metadata={"help": "MIS: a token (sequence) whose weight is below this gets weight 0; None: no bound."}
    )
    rollout_is_upper: Optional[float] = field(
        default=None, metadata={"help": "MIS: a token (sequence) whose weight is above this gets weight 0; None: no bound."}
    )

    @classmethod
    def with_outside_settings(cls, given):
        """`cls`, or (when `given`, the argument file's and command line's keys, names an outside
        policy loss or advantage estimator) the dataclass of the same name with that entry's
        declared settings as fields. A name that cannot be imported adds nothing (the start-up
        check reports it)."""
        for what, entry in outside_entries(given):
            cls = with_settings(cls, entry.declared, getattr(entry.fn, "__module__", None), f"{what} {given[what]}")
        return cls

    @property
    def policy_settings(self):
        """The chosen policy loss's own settings, name -> value (`UpdateSettings.policy_settings`)."""
        return find_policy_loss(self.policy_loss).settings_from(self)


def outside_entries(given):
    """`(field, entry)` of each outside entry (`module.path:NAME` that imports) that `given` (keys
    -> values) names for `policy_loss` or `adv_estimator`."""
    found = []
    for what, registry, kind in (("policy_loss", POLICY_LOSSES, PolicyLoss), ("adv_estimator", ADV_ESTIMATORS, AdvEstimator)):
        name = given.get(what)
        if isinstance(name, str) and ":" in name and name not in registry:
            try:
                found.append((what, find_entry(name, registry, kind, what)))
            except ValueError:
                continue
    return found


PolicyLossArguments = settings_dataclass(
    "PolicyLossArguments", [*POLICY_LOSS_SETTINGS.values(), *ESTIMATOR_SETTINGS.values()], (PolicyLossOptions,), __name__,
    "`PolicyLossOptions` and one field per setting the registered policy losses and advantage estimators declare "
    "(`POLICY_LOSS_SETTINGS`, `ESTIMATOR_SETTINGS`).",
    origins=setting_origins((POLICY_LOSSES, "policy_loss"), (ADV_ESTIMATORS, "adv_estimator")))


ROLLOUT_CORRECTION_FIELDS = ("rollout_is_threshold", "rollout_is_lower", "rollout_is_upper")


def _changed(args, name):
    """Whether `args.name` differs from its dataclass default."""
    return getattr(args, name) != type(args).__dataclass_fields__[name].default


def _foreign_settings(args, registry, chosen, what):
    """Settings of other `registry` entries, changed from their defaults, that `chosen` does not read."""
    own = set(chosen.settings) if chosen is not None else set()
    owners = {}
    for entry in registry.values():
        for name in entry.settings:
            if name not in own and hasattr(args, name):
                owners.setdefault(name, []).append(entry.name)
    return [f"{name}={getattr(args, name)!r} is a setting of {what} {' / '.join(owners[name])}; "
            f"{what} {getattr(args, what)} does not read it" for name in sorted(owners) if _changed(args, name)]


def chosen_policy_loss_problems(args):
    """`(entry or None, problems)` of `policy_loss`: its name (registered, or an outside entry
    that imports), the values of every declared setting, and the settings of other entries set
    although the chosen one does not read them."""
    try:
        entry = find_policy_loss(args.policy_loss)
    except ValueError as err:
        outside = f" or module.path:NAME of a ppo.algos.PolicyLoss ({err})" if ":" in str(args.policy_loss) else ""
        return None, [f"policy_loss must be one of {list(POLICY_LOSSES)}{outside}, got {args.policy_loss!r}"]
    outside = [s for s in entry.declared if s.name not in POLICY_LOSS_SETTINGS]
    problems = setting_problems(args, [*POLICY_LOSS_SETTINGS.values(), *outside])
    problems += [f"{name}: policy_loss {entry.name} reads it, but it is no argument (declare it as a ppo.algos.Setting)"
                 for name in entry.settings if not hasattr(args, name)]
    return entry, problems + _foreign_settings(args, POLICY_LOSSES, entry, "policy_loss")


def policy_loss_problems(args, estimator=None):
    """Every problem of the policy-loss group (`estimator`: the chosen `AdvEstimator`, or None
    when `adv_estimator` itself is refused)."""
    problems = chosen_policy_loss_problems(args)[1] + setting_problems(args, ESTIMATOR_SETTINGS.values())
    if estimator is not None:
        problems += setting_problems(args, [s for s in estimator.declared if s.name not in ESTIMATOR_SETTINGS])
        problems += _foreign_settings(args, ADV_ESTIMATORS, estimator, "adv_estimator")
        if "pass_k" in estimator.settings and isinstance(args.rollout_n, int) and not 1 <= args.pass_k <= args.rollout_n:
            problems.append(f"pass_k must be in [1, rollout_n={args.rollout_n}] (pass@k of a group), got {args.pass_k}")
    return problems + top_entropy_problems(args) + rollout_correction_problems(args)


def top_entropy_problems(args):
    """`top_entropy_frac` in (0, 1]; `top_entropy_norm` a choice, and set only where it acts."""
    problems = []
    if not 0.0 < args.top_entropy_frac <= 1.0:
        problems.append(f"top_entropy_frac must be in (0, 1] (1: every token), got {args.top_entropy_frac}")
    if args.top_entropy_norm not in TOP_ENTROPY_NORMS:
        problems.append(f"top_entropy_norm must be one of {TOP_ENTROPY_NORMS}, got {args.top_entropy_norm!r}")
    elif args.top_entropy_frac == 1.0 and _changed(args, "top_entropy_norm"):
        problems.append(f"top_entropy_norm={args.top_entropy_norm!r} acts with top_entropy_frac < 1; "
                        "top_entropy_frac is 1.0 (every token)")
    return problems


def policy_loss_startup_line(args):
    """The start-up log line of the policy loss: its aggregation and why, the other loss terms'
    aggregation, and with `top_entropy_frac` < 1 the normaliser of the kept tokens."""
    entry = find_policy_loss(args.policy_loss)
    mode, why = entry.aggregation(args.loss_agg_mode)
    terms = args.loss_agg_mode if args.loss_agg_mode is not None else LOSS_AGG_MODES[0]
    line = f"policy_loss {entry.name}: loss_agg_mode {mode} ({why}); value, entropy and KL terms: {terms}"
    if args.top_entropy_frac < 1.0:
        by = "the kept tokens only" if args.top_entropy_norm == "kept" else "every response token"
        line += f"; top_entropy_frac {args.top_entropy_frac}: divided by {by} (top_entropy_norm {args.top_entropy_norm})"
    return line


def rollout_correction_problems(args):
    """`rollout_is` is a level, its bounds make sense, and they act: with a correction, the
    old log-probs must come from the training forward."""
    if args.rollout_is not in ROLLOUT_IS_LEVELS:
        return [f"rollout_is must be one of {ROLLOUT_IS_LEVELS}, got {args.rollout_is!r}"]
    if args.rollout_is == "none":
        return [f"{name}={getattr(args, name)!r} acts with rollout_is token or sequence; rollout_is is none"
                for name in ROLLOUT_CORRECTION_FIELDS if _changed(args, name)]
    problems = []
    low, high, cap = args.rollout_is_lower, args.rollout_is_upper, args.rollout_is_threshold
    if cap is not None and not cap > 0:
        problems.append(f"rollout_is_threshold must be > 0 (None: no truncation), got {cap}")
    if low is not None and high is not None and not low < high:
        problems.append(f"rollout_is_lower ({low}) must be < rollout_is_upper ({high})")
    if args.use_rollout_logprobs:
        problems.append(f"rollout_is {args.rollout_is} weighs the loss by the training forward's log-probs over the "
                        "engine's; use_rollout_logprobs true makes the engine's the old log-probs (every weight 1): "
                        "set use_rollout_logprobs false")
    return problems
