"""The staged `Experience` of a PPO step and its row operations: one `ObjectiveTrace` per scored
objective, `experience_from_rollout` (stage "rollout"), the loss's view of a micro-batch
(`loss_view`) and padding / merging experiences of different widths (`pad_experience`,
`merge_rows`). Tensor layout and stages: `ppo/experience/__init__.py`."""
from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import Dict, List, Optional

import numpy as np
import paddle

from ..models.causal_lm import last_token_index, position_ids_from_mask
from ..models.routing_replay import pad_routing

STAGES = ("rollout", "scored", "complete")
ROW_TENSORS = ("sequences", "attention_mask", "position_ids", "response_ids", "response_mask", "group_ids", "old_logprobs",
               "ref_logprobs", "advantages", "ends_with_eos", "rollout_logprobs", "rollout_is_weights", "env_rewards", "routing",
               "token_versions")
ROW_LISTS = ("src", "label", "prompt_text", "response_text", "turns")


@dataclass
class ObjectiveTrace:
    """One scored objective's part of an experience (the reward, a cost, ...): the raw scores
    `[N]` its scorer gave, and once complete its critic's values, its token rewards, advantages
    and returns `[N, Tr]` (values None without a critic). A process reward model's scorer with
    `prm_reduction step` also gives `step_rewards` `[N, Tr]` (each step's score at its last token)
    and `step_mask` `[N, Tr]` (1 at those tokens)."""

    scores: paddle.Tensor
    values: Optional[paddle.Tensor] = None
    rewards: Optional[paddle.Tensor] = None
    advantages: Optional[paddle.Tensor] = None
    returns: Optional[paddle.Tensor] = None
    step_rewards: Optional[paddle.Tensor] = None
    step_mask: Optional[paddle.Tensor] = None

    def map(self, fn):
        """A new trace with `fn` applied to every tensor that is set."""
        return ObjectiveTrace(**{f.name: (None if getattr(self, f.name) is None else fn(getattr(self, f.name)))
                                 for f in fields(self)})


@dataclass
class Experience:
    """One rollout batch and everything computed from it; tensors have `N` rows. `objectives`
    holds one `ObjectiveTrace` per scored objective, in the run's order (the first is the
    reward the policy is ranked by); `advantages` is the one the actor trains on (the
    objectives' advantages combined). `version`: the training steps completed by the weights
    that sampled it."""

    prompt_len: int
    sequences: paddle.Tensor  # [N, T] int64
    attention_mask: paddle.Tensor  # [N, T] int64
    position_ids: paddle.Tensor  # [N, T] int64
    response_ids: paddle.Tensor  # [N, Tr] int64
    response_mask: paddle.Tensor  # [N, Tr] float32, 1 up to and including the stop token
    group_ids: paddle.Tensor  # [N] int64, rows of one prompt share an id
    src: List[str]
    label: List[Optional[str]]
    prompt_text: List[str]
    old_logprobs: Optional[paddle.Tensor] = None  # [N, Tr]
    ref_logprobs: Optional[paddle.Tensor] = None  # [N, Tr]
    rollout_logprobs: Optional[paddle.Tensor] = None  # [N, Tr], the engine's; None when they are old_logprobs
    rollout_is_weights: Optional[paddle.Tensor] = None  # [N, Tr], the rollout correction's (None: no correction)
    advantages: Optional[paddle.Tensor] = None  # [N, Tr], the actor's
    ends_with_eos: Optional[paddle.Tensor] = None  # [N] bool
    objectives: Dict[str, ObjectiveTrace] = field(default_factory=dict)
    stage: str = "rollout"  # one of STAGES
    version: int = 0
    # multi-turn rollouts (`ppo.trainer.agent_rollout`): the response columns hold policy turns and
    # the environment's answers, `response_mask` is the policy mask (1 on policy tokens only)
    env_rewards: Optional[paddle.Tensor] = None  # [N, Tr] the environment's rewards (turn_reward_mode)
    response_text: Optional[List[str]] = None  # what scorers rate: every turn and answer after the prompt
    turns: Optional[List[dict]] = None  # each trajectory's segments with their roles (samples.jsonl)
    # routing replay (`moe_routing_replay rollout`, `ppo.models.routing_replay`): the experts the
    # rollout routed each token of `sequences` to, replayed by the actor's forwards
    routing: Optional[paddle.Tensor] = None  # [N, T, L, k] int32, -1: not replayed
    # partial rollouts (`partial_rollout`, `ppo.rollout.partial`): the weights version that sampled
    # each response token; None when one version (`version`) sampled the whole batch
    token_versions: Optional[paddle.Tensor] = None  # [N, Tr] int64, -1 after a row's end
    # `reuse_first_update_forward`: the update's first training forward over all rows, with
    # gradients ({"logprobs", "entropy", "values"} [N, Tr]), run by `AdvantageStage` and taken by
    # the updater's first optimiser step; a copy of other rows (`map_rows`) does not carry it
    first_forward: Optional[dict] = None

    def __len__(self):
        return self.sequences.shape[0]

    @property
    def scores(self):
        """The first objective's raw scores `[N]` (the reward), None before scoring."""
        return next(iter(self.objectives.values())).scores if self.objectives else None

    def map_rows(self, tensor_fn, list_fn):
        """A new experience with `tensor_fn` applied to every row tensor (the objectives' too)
        and `list_fn` to every row list; the other fields are kept."""
        out = Experience(**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "first_forward"})
        for name in ROW_TENSORS:
            if getattr(self, name) is not None:
                setattr(out, name, tensor_fn(getattr(self, name)))
        for name in ROW_LISTS:
            if getattr(self, name) is not None:
                setattr(out, name, list_fn(getattr(self, name)))
        out.objectives = {name: trace.map(tensor_fn) for name, trace in self.objectives.items()}
        return out

    def select(self, index):
        """The rows `index` (a list or array of ints) as a new `Experience`."""
        idx = paddle.to_tensor(np.asarray(index, dtype="int64"))
        return self.map_rows(lambda t: paddle.index_select(t, idx, axis=0), lambda xs: [xs[i] for i in index])

    @staticmethod
    def concat(parts):
        """Rows of several experiences with the same prompt and response widths."""
        first = parts[0]
        out = first.map_rows(lambda t: t, list)
        for name in ROW_TENSORS:
            if getattr(first, name) is not None:
                setattr(out, name, paddle.concat([getattr(p, name) for p in parts], axis=0))
        for name in ROW_LISTS:
            if getattr(first, name) is not None:
                setattr(out, name, [v for p in parts for v in getattr(p, name)])
        for key, trace in first.objectives.items():
            out.objectives[key] = ObjectiveTrace(**{
                f.name: (None if getattr(trace, f.name) is None
                         else paddle.concat([getattr(p.objectives[key], f.name) for p in parts], axis=0))
                for f in fields(trace)})
        return out

    def advance(self, stage):
        """Mark the experience as having reached `stage`, checking the fields it needs."""
        missing = []
        if stage in ("scored", "complete") and not self.objectives:
            missing.append("scores")
        if stage == "complete":
            missing += [name for name in ("old_logprobs", "ref_logprobs", "advantages") if getattr(self, name) is None]
            missing += [f"{key}.{name}" for key, trace in self.objectives.items() for name in ("rewards", "advantages")
                        if getattr(trace, name) is None]
        if stage not in STAGES or missing:
            raise ValueError(f"experience cannot reach stage {stage!r}: missing {missing or 'a known stage name'}")
        self.stage = stage
        return self

    def require(self, stage):
        """Raise unless the experience has reached `stage`."""
        if STAGES.index(self.stage) < STAGES.index(stage):
            raise RuntimeError(f"this step needs a {stage!r} experience, got one at stage {self.stage!r}")

    def loss_tensors(self):
        """The tensors the actor and critic losses read, by flat name (`values.<objective>`,
        `returns.<objective>` for each objective's critic); those that are set."""
        named = {name: getattr(self, name) for name in LOSS_FIELDS if getattr(self, name) is not None}
        for key, trace in self.objectives.items():
            for name in ("values", "returns"):
                if getattr(trace, name) is not None:
                    named[f"{name}.{key}"] = getattr(trace, name)
        return named


LOSS_FIELDS = ("response_ids", "response_mask", "old_logprobs", "advantages", "ref_logprobs", "rollout_is_weights")
"""Experience fields the actor's loss reads (`Experience.loss_tensors` adds the critics')."""


def loss_view(prompt_len, named):
    """What the losses read of a micro-batch, from `Experience.loss_tensors`' flat names: an
    object with `prompt_len`, the `LOSS_FIELDS` (None when absent) and `objectives` (per
    objective `values` and `returns`)."""
    view = SimpleNamespace(prompt_len=prompt_len, objectives={}, **dict.fromkeys(LOSS_FIELDS))
    for name, value in named.items():
        if "." in name:
            field_name, key = name.split(".", 1)
            trace = view.objectives.setdefault(key, SimpleNamespace(values=None, returns=None))
            setattr(trace, field_name, value)
        else:
            setattr(view, name, value)
    return view


def experience_from_rollout(batch, out, eos_token_id, repeat=1, group_base=0):
    """An `Experience` from a collated prompt batch (`PromptOnlyCollator` output, prompts
    not yet repeated) and the engine's `RolloutOutput` for `repeat` samples per prompt."""
    prompt_mask = paddle.repeat_interleave(batch["attention_mask"], repeat, axis=0) if repeat > 1 else batch["attention_mask"]
    attention_mask = paddle.concat([prompt_mask.astype("int64"), out.response_mask.astype("int64")], axis=1)
    last = last_token_index(out.response_mask).unsqueeze(-1)
    last_token = paddle.take_along_axis(out.response_ids, last, axis=1).squeeze(-1)
    repeated = lambda xs: [x for x in xs for _ in range(repeat)]
    n_prompts = len(batch["prompt"])
    return Experience(
        prompt_len=prompt_mask.shape[1],
        sequences=out.sequences,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        response_ids=out.response_ids,
        response_mask=out.response_mask.astype("float32"),
        group_ids=paddle.to_tensor(np.repeat(np.arange(n_prompts) + group_base, repeat), dtype="int64"),
        src=repeated(batch["src"]),
        label=repeated(batch["label"]),
        prompt_text=repeated(batch["prompt"]),
        ends_with_eos=(last_token == eos_token_id) & (out.response_lengths > 0),
    )


def pad_columns(t, left, right, value):
    """`t [N, L]` with `left`/`right` columns of `value` added."""
    parts = [paddle.full([t.shape[0], left], value, t.dtype)] if left else []
    parts.append(t)
    if right:
        parts.append(paddle.full([t.shape[0], right], value, t.dtype))
    return paddle.concat(parts, axis=1) if len(parts) > 1 else t


def pad_experience(exp, Tp, Tr, pad_id):
    """Rollout fields of `exp` padded to prompt width `Tp` (left) and response width `Tr` (right)."""
    dp, dr = Tp - exp.prompt_len, Tr - exp.response_ids.shape[1]
    if dp == 0 and dr == 0:
        return exp
    P = exp.prompt_len
    out = exp.select(list(range(len(exp))))
    out.prompt_len = Tp
    out.sequences = paddle.concat([pad_columns(exp.sequences[:, :P], dp, 0, pad_id), pad_columns(exp.sequences[:, P:], 0, dr, pad_id)], axis=1)
    out.attention_mask = paddle.concat(
        [pad_columns(exp.attention_mask[:, :P], dp, 0, 0), pad_columns(exp.attention_mask[:, P:], 0, dr, 0)], axis=1
    )
    out.position_ids = position_ids_from_mask(out.attention_mask)
    out.response_ids = pad_columns(exp.response_ids, 0, dr, pad_id)
    out.response_mask = pad_columns(exp.response_mask, 0, dr, 0.0)
    for name in ("old_logprobs", "rollout_logprobs", "env_rewards"):
        if getattr(exp, name) is not None:
            setattr(out, name, pad_columns(getattr(exp, name), 0, dr, 0.0))
    if exp.token_versions is not None:
        out.token_versions = pad_columns(exp.token_versions, 0, dr, -1)
    if exp.routing is not None:
        out.routing = pad_routing(exp.routing, dp, dr, P)
    for trace in out.objectives.values():  # a process reward model's step tensors [N, Tr]
        for name in ("step_rewards", "step_mask"):
            if getattr(trace, name) is not None:
                setattr(trace, name, pad_columns(getattr(trace, name), 0, dr, 0.0))
    return out


def merge_rows(parts, pad_id):
    """Concatenate experiences whose prompt/response widths may differ."""
    Tp = max(p.prompt_len for p in parts)
    Tr = max(p.response_ids.shape[1] for p in parts)
    return Experience.concat([pad_experience(p, Tp, Tr, pad_id) for p in parts])
