"""The argument-file keys of multi-turn, tool-using rollouts, as one group of their own.

``AgentArguments`` is a dataclass like the groups of ppo/entry/argument_groups.py (every field
has a help, problems are collected in ``__post_init__``); an entry point mixes it into its
training arguments and adds :func:`agent_problems` to its start-up pass, so an environment
that does not exist, cannot be imported, lacks ``reset``/``step`` or does not take
``env_kwargs`` stops the run before any model loads. The run builder hands the agent rollout
``AgentSettings.of(args)``: the same fields, frozen, never the whole argument object.
"""
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, make_dataclass
from typing import ClassVar

from ..common.argument_problems import resolve_arguments
from .environment import environment_problems
from .trajectory import TURN_REWARD_MODES


@dataclass
class AgentArguments:
    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"turn_reward_mode": "ppo.agents.trajectory:TURN_REWARD_MODES"}
    env_name: str = field(
        default="",
        metadata={"help": "Environment of multi-turn rollouts: a registered name (tools) or module.path:Class; "
                  "empty: single-turn rollouts (one answer per prompt)."},
    )
    env_kwargs: str = field(
        default="{}",
        metadata={"help": "JSON object of the environment's constructor arguments, e.g. {\"tools\": [\"calculator\"]} "
                  "(an object in the argument file)."},
    )
    max_turns: int = field(default=4, metadata={"help": "Most policy turns per trajectory; the episode is cut (truncated) after it."})
    max_tool_response_len: int = field(
        default=256, metadata={"help": "Most tokens of one tool answer (or user turn) fed back; longer ones are cut."}
    )
    max_total_len: int = field(
        default=1024,
        metadata={"help": "Most tokens of a whole trajectory (prompt, every turn and every answer); a trajectory that "
                  "reaches it is cut (truncated)."},
    )
    step_timeout_s: float = field(
        default=600.0,
        metadata={"help": "Seconds one env.step (a tool call with the environment's own work) may take; a row whose "
                  "step runs longer ends (env_timeout, counted as an environment failure), the other rows go on."},
    )
    tool_timeout_s: float = field(
        default=0.0,
        metadata={"help": "Seconds one tool call may take (an async tool is cancelled, a thread left, a worker process "
                  "killed); the call's answer is a timeout error and the episode goes on; 0: each tool's own timeout_s."},
    )
    trajectory_timeout_s: float = field(
        default=0.0,
        metadata={"help": "Seconds one trajectory may take from its start (turns and tool calls together); a row past "
                  "it ends (trajectory_timeout, truncated), the other rows go on; 0: no limit."},
    )
    max_concurrent_tool_calls: int = field(
        default=0,
        metadata={"help": "Most tool calls running at once in a process, over all rows and every call of a turn (so "
                  "also the most python sandboxes / tool worker processes busy); a call waits for a slot (the wait "
                  "counts against step_timeout_s); 0: no cap."},
    )
    turn_reward_mode: str = field(
        default=TURN_REWARD_MODES[0],
        metadata={"help": "Where the environment's rewards go: final = their sum at the last policy token; per_turn = "
                  "each turn's reward at that turn's last token."},
    )
    env_reward_weight: float = field(
        default=1.0,
        metadata={"help": "Weight of the environment's rewards: weight * (their sum) is added to the reward's score (a "
                  "reward model, server or rule scorer); without one, weight * (their sum) is the reward."},
    )
    max_tool_failure_frac: float = field(
        default=0.5,
        metadata={"help": "Training: a step on which more than this fraction of the trajectories had a tool fail (raise, "
                  "time out) or the environment fail counts as a failed step; tool_failure_steps of them in a row stop "
                  "the run after saving."},
    )
    tool_failure_steps: int = field(
        default=3, metadata={"help": "Training: consecutive failed steps (see max_tool_failure_frac) that stop the run."}
    )
    sample_token_details: bool = field(
        default=False,
        metadata={"help": "Training: samples.jsonl rows also carry prompt_ids, response_ids, the policy (loss) mask and "
                  "the sampling log-probs of each response token, to check a trajectory's mask without running code in "
                  "the trainer (single-turn runs too); off by default (a row gets several times larger)."},
    )
    reuse_trajectory_logprobs: bool = field(
        default=False,
        metadata={"help": "Training: the engine's log-probs of the policy's tokens are the old log-probs (no old-log-prob "
                  "pass; needs use_rollout_logprobs true). They depend at float rounding on how the rows were scheduled "
                  "(when each tool answered), so a resumed run then matches an uninterrupted one only up to rounding; "
                  "false: the training forward's."},
    )

    __post_init__ = resolve_arguments  # the one pass (built alone, or as a group of the training arguments)

    def resolve_group(self):
        return agent_value_problems(self)

    @property
    def env_options(self):
        """`env_kwargs` as a dict (a JSON object string or a dict)."""
        return env_options_of(self.env_kwargs)

    @property
    def multi_turn(self):
        return bool(self.env_name)


def agent_value_problems(args):
    """The problems of the agent fields' values of `args` (an `AgentArguments` or `AgentSettings`;
    `use_rollout_logprobs` is read when `args` has it)."""
    problems = []
    if not args.step_timeout_s > 0:
        problems.append(f"step_timeout_s must be > 0, got {args.step_timeout_s}")
    if args.env_reward_weight != args.env_reward_weight or abs(args.env_reward_weight) == float("inf"):
        problems.append(f"env_reward_weight must be a finite number, got {args.env_reward_weight}")
    for name in ("tool_timeout_s", "trajectory_timeout_s", "max_concurrent_tool_calls"):
        if not getattr(args, name) >= 0:
            problems.append(f"{name} must be >= 0 (0: none), got {getattr(args, name)}")
    if not 0.0 <= args.max_tool_failure_frac < 1.0:
        problems.append(f"max_tool_failure_frac must be in [0, 1), got {args.max_tool_failure_frac}")
    for name in ("max_turns", "max_tool_response_len", "max_total_len", "tool_failure_steps"):
        if getattr(args, name) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(args, name)}")
    if args.reuse_trajectory_logprobs and not args.env_name:
        problems.append("reuse_trajectory_logprobs acts on multi-turn rollouts: give env_name")
    if args.reuse_trajectory_logprobs and not getattr(args, "use_rollout_logprobs", True):
        problems.append("reuse_trajectory_logprobs makes the engine's log-probs the old log-probs; "
                        "use_rollout_logprobs false says not to: set one of them")
    if args.turn_reward_mode not in TURN_REWARD_MODES:
        problems.append(f"turn_reward_mode must be one of {TURN_REWARD_MODES}, got {args.turn_reward_mode!r}")
    try:
        env_options_of(args.env_kwargs)
    except ValueError as err:
        problems.append(str(err))
    return problems


def env_options_of(value):
    """`env_kwargs` (a JSON object string or a dict) as a new dict; ValueError otherwise."""
    if isinstance(value, Mapping):
        return dict(value)
    try:
        parsed = json.loads(value or "{}")
    except ValueError as err:
        raise ValueError(f"env_kwargs must be a JSON object, got {value!r} ({err})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"env_kwargs must be a JSON object, got {value!r}")
    return parsed


class _AgentSlice:
    """What `AgentSettings` adds to its fields: the parsed options, the check, the slicing."""

    env_options = AgentArguments.env_options
    multi_turn = AgentArguments.multi_turn

    def __post_init__(self):
        problems = agent_value_problems(self)
        if problems:
            raise ValueError("AgentSettings: " + "; ".join(problems))

    @classmethod
    def of(cls, args):
        """The agent fields of `args` (the parsed arguments of an entry point, or `AgentArguments`)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


AgentSettings = make_dataclass(
    "AgentSettings", [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in fields(AgentArguments)],
    bases=(_AgentSlice,), frozen=True, namespace={"__doc__": (
        "The agent rollout's slice of the arguments: the fields of `AgentArguments` (declared there "
        "once), frozen and checked; `AgentSettings.of(args)` takes them from the parsed arguments."),
        "__module__": __name__})


def agent_problems(args):
    """The start-up pass's check of the environment (a list of messages; empty when fine):
    it is imported and its class and constructor checked, no model is needed."""
    if not getattr(args, "env_name", ""):
        return []
    try:
        options = args.env_options
    except ValueError:
        return []  # already reported by the arguments' own checks
    return [f"env_name {args.env_name}: {p}" for p in environment_problems(args.env_name, options)]
