"""Arguments of `dpo/run_online_dpo.py` (online / iterative DPO).

The policy, reference and score source use `run_ppo.py`'s names (`ModelArgument`:
`actor_model_name_or_path`, `reference_model_name_or_path`, `reward_model_name_or_path`,
`use_rm_server`, `use_rule_reward`, ...), the rollout PaddleNLP's PPO names
(`per_device_prompt_batch_size`, `rollout_n`, `max_dec_len`, ...: the shared `RolloutArguments`
of `ppo/entry/argument_groups.py`, with `rollout_n` 4 by default), the loss the DPO
trainer's (`loss_type`, `beta`, `sft_loss_ratio`, ...); what neither has follows TRL's
`OnlineDPOConfig` or is new (`pair_selection`, `pair_margin`, `ref_update_rounds`).
One training step is one round. Defaults live here only.
"""
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ppo.algos.preference_registry import PREFERENCE_LOSSES
from ppo.common import paddlenlp_keys as pk
from ppo.common import validation
from ppo.common.registry_settings import Setting, setting_field
from ppo.judge import scorer as judge_scorer
from ppo.strategy import expert_layout_problems
from ppo.models.hf_import import hf_config_problems
from ppo.entry.argument_groups import (
    OnlineRolloutArguments,
    PaddleNLPTrainingArguments,
    RolloutArguments,
    default_override,
)
from ppo.entry.ppo_arguments import DataArgument as PPODataArgument
from ppo.entry.ppo_arguments import ModelArgument as PPOModelArgument

from .online_pairs import PAIR_SELECTIONS
from .preference_arguments import PreferenceLossArguments
from .preference_objective import needs_reference

ONLINE_LOSS_TYPES = tuple(name for name, loss in PREFERENCE_LOSSES.items() if loss.data == "pairs" and not loss.kl_point)
"""The registry's pair losses (KTO's need a KL point from mismatched pairs, which rounds do not make)."""


def _words(value):
    return value if isinstance(value, str) else ",".join(value)


def _lower(help_text):
    return help_text[:1].lower() + help_text[1:]


def judge_settings(scorer_settings):
    """Online DPO's `judge_*` settings, derived from the judge scorer's declarations
    (`scorer_settings`: `ppo.judge.scorer.SETTINGS`), so that a default changed there changes here:
    `judge_template` / `judge_pair_template` are its `template` / `pair_template`, `judge_words` its
    `yes` and `no` as one comma-separated text, `judge_pair_words` its `pair_words`."""
    s = {setting.name: setting for setting in scorer_settings}
    return (
        Setting("judge_template", str, s["template"].default,
                s["template"].help + " Its verdict is the round's score when nothing else scores."),
        Setting("judge_pair_template", str, s["pair_template"].default, s["pair_template"].help),
        Setting("judge_words", str, f"{s['yes'].default},{s['no'].default}",
                f"The judge scorer's yes and no, comma-separated: {_lower(s['yes'].help).rstrip('.')}, then "
                f"{_lower(s['no'].help)}"),
        Setting("judge_pair_words", str, _words(s["pair_words"].default),
                f"The judge scorer's pair_words, comma-separated: {_lower(s['pair_words'].help)}"),
    )


JUDGE_SETTINGS = {setting.name: setting for setting in judge_settings(judge_scorer.SETTINGS)}
"""name -> `Setting` of the `judge_*` fields of `ModelArgument` (generated from these)."""
JUDGE_DEFAULTS = {name: setting.default for name, setting in JUDGE_SETTINGS.items()}
JUDGE_RUBRICS = {"judge_template": "template", "judge_pair_template": "pair_template"}
"""The rubric fields and the scorer option whose check (`ppo.judge.scorer.rubric_problem`) they share."""


def _judge_field(name):
    return setting_field(JUDGE_SETTINGS[name])[2]


@dataclass
class ModelArgument(PPOModelArgument):
    """`run_ppo.py`'s model arguments; online DPO has no critic. The `judge_*` fields pick the pairs
    with a generative judge (`dpo/pair_choice.py`)."""

    judge_model: Optional[str] = field(
        default=None,
        metadata={"help": "Choose each round's pairs by a generative judge's pairwise verdict (both orders averaged) "
                  "instead of the scores: a model directory, or `policy` for the policy itself at that round "
                  "(self-rewarding). Without a reward model, reward server or rule scorer, the judge's pointwise "
                  "verdict (judge_template) is the round's score too."},
    )
    # the judge scorer's settings (judge_settings): defaults, help and rubric checks are its declarations'
    judge_template: str = _judge_field("judge_template")
    judge_pair_template: str = _judge_field("judge_pair_template")
    judge_words: str = _judge_field("judge_words")
    judge_pair_words: str = _judge_field("judge_pair_words")
    setting_declarations = {name: (setting, judge_scorer.__name__, "scorer judge")
                            for name, setting in JUDGE_SETTINGS.items()}  # the argument table watches the scorer

    def resolve_group(self):
        problems = ["reward_critic_model_name_or_path: online DPO trains no critic; remove it"] \
            if self.reward_critic_model_name_or_path else []
        return problems + self.judge_problems()

    def judge_problems(self):
        """Judge settings without a judge (they would be ignored), templates that are neither a
        built-in name nor a text with their fields, verdict words that are not two words."""
        if not self.judge_model:
            return [f"{name} {getattr(self, name)!r} is read only with judge_model; set judge_model (a model "
                    "directory, or policy) or remove it" for name, default in JUDGE_DEFAULTS.items()
                    if getattr(self, name) != default]
        problems = []
        for name, option in JUDGE_RUBRICS.items():
            problem = judge_scorer.rubric_problem(getattr(self, name), judge_scorer.RUBRICS[option])
            if problem:
                problems.append(f"{name}: {problem}")
        for name in ("judge_words", "judge_pair_words"):
            if len([w for w in getattr(self, name).split(",") if w]) != 2:
                problems.append(f"{name} must be two comma-separated words, got {getattr(self, name)!r}")
        return problems

    @property
    def judge_scores(self):
        """The judge's pointwise verdict is the round's score: a judge and no other score source."""
        return bool(self.judge_model) and not (self.external_scores or self.reward_model_name_or_path)


@dataclass
class DataArgument(PPODataArgument):
    """`run_ppo.py`'s data arguments; the supervised term is `sft_loss_ratio` on the chosen answers."""

    def resolve_group(self):
        if self.ptx_datasets:
            return ["ptx_datasets: online DPO has no ptx loss; sft_loss_ratio adds the NLL of the chosen answers"]
        return []


@dataclass
class OnlineDPOTrainingArguments(PreferenceLossArguments, OnlineRolloutArguments, PaddleNLPTrainingArguments):
    """The rollout, its generation and log-probs, the divergence stop and the loop's optimiser
    (`OnlineRolloutArguments`) are `run_ppo.py`'s; the fields below are online DPO's own."""

    paddlenlp_fixed_fields: ClassVar[tuple] = tuple(pk.PPO_FIXED_VALUE)  # checked by ppo.common.argument_parsing
    field_choices: ClassVar[dict] = {"pair_selection": "dpo.online_pairs:PAIR_SELECTIONS",  # checked before Paddle loads
                                     "loss_type": "dpo.online_dpo_arguments:ONLINE_LOSS_TYPES"}
    # a pair needs two answers per prompt: 4 samples by default (run_ppo.py: 1)
    rollout_n: int = default_override(RolloutArguments, "rollout_n", 4)
    # pairs
    pair_selection: str = field(
        default="best_worst",
        metadata={"help": f"{' | '.join(PAIR_SELECTIONS)}: the best against the worst answer of each prompt, or every "
                  "pair whose score gap exceeds pair_margin. Prompts whose answers all score alike give no pair."},
    )
    pair_margin: float = field(default=0.0, metadata={"help": "Smallest score gap (exclusive) that makes a pair."})
    # loss (the DPO trainer's names and hyperparameters: PreferenceLossArguments)
    loss_type: str = field(default="sigmoid", metadata={"help": f"Preference loss: {' | '.join(ONLINE_LOSS_TYPES)}."})
    # rounds
    ref_update_rounds: int = field(
        default=0,
        metadata={"help": "Copy the policy into the reference every this many rounds (iterative DPO); 0: fixed reference."},
    )

    def resolve_group(self):
        problems = self.round_problems() + self.loss_problems()
        if not self.paddlenlp_refused:
            problems += pk.ppo_value_problems(self) + self.parallel_problems()
        return problems

    def round_problems(self):
        """Pairs need two answers per prompt; margins, refresh period and round count in range."""
        problems = []
        if self.rollout_n < 2:
            problems.append(f"rollout_n must be >= 2 (a pair needs two answers per prompt), got {self.rollout_n}")
        if self.pair_selection not in PAIR_SELECTIONS:
            problems.append(f"pair_selection must be one of {PAIR_SELECTIONS}, got {self.pair_selection!r}")
        if self.pair_margin < 0:
            problems.append(f"pair_margin must be >= 0, got {self.pair_margin}")
        if self.ref_update_rounds < 0:
            problems.append(f"ref_update_rounds must be >= 0 (0: fixed reference), got {self.ref_update_rounds}")
        if self.ref_update_rounds and self.loss_type in ONLINE_LOSS_TYPES and not self.uses_reference:
            problems.append(f"ref_update_rounds refreshes the reference; loss_type {self.loss_type} uses none")
        if self.max_steps <= 0:
            problems.append(f"max_steps is the number of rounds and must be positive, got {self.max_steps}")
        return problems

    def loss_problems(self):
        """The loss type is a pair loss of the registry, and its settings fit the registry's facts."""
        if self.loss_type not in ONLINE_LOSS_TYPES:
            return [f"loss_type must be one of {ONLINE_LOSS_TYPES}, got {self.loss_type!r}"]
        return self.preference_loss_problems()

    def parallel_problems(self):
        """Settings this loop does not run: it trains on one process (no tensor, pipeline or sharding
        parallelism) and in float32 or bf16/fp16 O2."""
        problems = []
        for name in ("tensor_parallel_degree", "pipeline_parallel_degree", "sharding_parallel_degree"):
            if getattr(self, name, 1) > 1:
                problems.append(f"{name} {getattr(self, name)}: online DPO runs on one process; set it to 1")
        if (self.bf16 or self.fp16) and str(self.fp16_opt_level).upper() != "O2":
            problems.append("bf16/fp16 load the models in half precision with float32 master weights (O2): set fp16_opt_level O2")
        if any(name != "visualdl" for name in self.report_to):
            problems.append(f"report_to {self.report_to}: the online DPO loop reports to visualdl (and metrics.jsonl) only")
        return problems

    @property
    def uses_reference(self):
        """Whether the loss reads reference log-probs (its registry fact, `reference_free`)."""
        return needs_reference(self.loss_type, self.reference_free)

    @property
    def evaluates(self):
        strategy = str(getattr(self.evaluation_strategy, "value", self.evaluation_strategy))
        return bool(self.do_eval) and strategy == "steps" and bool(self.eval_steps)

    @property
    def saves_checkpoints(self):
        return str(getattr(self.save_strategy, "value", self.save_strategy)) == "steps"


def validate_arguments(model_args, data_args, training_args):
    """Every cross-group and file-system problem of an online DPO run, before any model loads."""
    model_dirs = [(f"{n}_model_name_or_path", getattr(model_args, f"{n}_model_name_or_path")) for n in ("actor", "reference")]
    score_dirs = [] if model_args.external_scores or model_args.judge_scores else [
        ("reward_model_name_or_path", model_args.reward_model_name_or_path)]
    problems = validation.size_problems(model_args, data_args, training_args)
    problems += validation.required_problems(model_args, ["actor_model_name_or_path"])
    problems += expert_layout_problems(training_args, supported=False)
    if not model_args.external_scores and not model_args.judge_model:
        problems += validation.required_problems(
            model_args, ["reward_model_name_or_path"], " unless use_rm_server, use_rule_reward or judge_model is set")
    if model_args.judge_model and model_args.judge_model != "policy":
        model_dirs.append(("judge_model", model_args.judge_model))
    shared_reference = model_args.use_lora and model_args.reference_model_name_or_path in (None, "", model_args.actor_model_name_or_path)
    if training_args.ref_update_rounds and shared_reference:
        problems.append("ref_update_rounds with use_lora: the reference is the policy with its adapter off and cannot be "
                        "refreshed; set ref_update_rounds 0 or give a reference_model_name_or_path")
    problems += validation.model_dir_problems(model_dirs, score_dirs)
    problems += hf_config_problems(model_dirs + score_dirs)
    problems += validation.output_dir_problems(training_args.output_dir, model_dirs + score_dirs)
    problems += validation.dtype_device_problems(training_args)
    problems += validation.split_logits_problems(model_args, training_args)
    return problems
