"""Trajectories of a multi-turn rollout: segments owned by the policy or by the environment.

A :class:`Trajectory` is the token sequence of one episode cut into :class:`Segment` s, in
order: the prompt (system and user turns, template header), then policy turns, each followed
(unless it was the last) by what the environment answered: template glue, a tool's answer or a
user's turn, glue again. Each segment holds the token ids that were generated (policy) or fed
(environment) -- the ids the trajectory trains on; re-tokenising the final text is only a
check (:func:`tokenization_drift`). Policy segments also hold the rollout engine's log-prob of
every token (the sampling distribution at the sampling temperature).

:func:`policy_mask` is the one place that says which tokens the policy loss, KL, entropy and
value loss see: exactly the tokens of policy segments. :func:`collate_trajectories` lays a
batch out as the trainers lay out single-turn rollouts (left-padded prompt columns, then
right-padded response columns) with that mask as the response mask, and the environment's
rewards at the last token of the turn they rate (``turn_reward_mode`` "per_turn") or summed
at the last policy token ("final").
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

SEGMENT_KINDS = ("prompt", "policy", "glue", "tool", "user")
TURN_REWARD_MODES = ("final", "per_turn")  # the first: the default of `turn_reward_mode`


@dataclass
class Segment:
    """A run of tokens owned by one party: ``kind`` "policy" (generated) or "prompt", "glue",
    "tool", "user" (fed by the environment and the chat template)."""

    kind: str
    token_ids: List[int]
    text: str = ""
    logprobs: Optional[List[float]] = None
    turn: int = 0

    def __post_init__(self):
        if self.kind not in SEGMENT_KINDS:
            raise ValueError(f"segment kind must be one of {SEGMENT_KINDS}, got {self.kind!r}")
        if (self.kind == "policy") != (self.logprobs is not None):
            raise ValueError("policy segments carry one log-prob per token; environment segments none")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} log-probs for {len(self.token_ids)} tokens")

    @property
    def is_policy(self):
        return self.kind == "policy"


@dataclass
class Trajectory:
    """One episode (see the module docstring). ``rewards[k]`` is the environment's reward for
    policy turn k; ``stop_reason`` says why it ended ("done": the environment ended it;
    "max_turns", "max_total_len": cut off, ``truncated``; "env_error", "env_timeout")."""

    segments: List[Segment] = field(default_factory=list)
    record: Any = None
    rewards: List[float] = field(default_factory=list)
    stop_reason: str = ""
    truncated: bool = False
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)
    messages: List[Dict[str, str]] = field(default_factory=list)
    token_times: List[float] = field(default_factory=list)

    @property
    def token_ids(self):
        return [t for s in self.segments for t in s.token_ids]

    @property
    def text(self):
        return "".join(s.text for s in self.segments)

    @property
    def response_text(self):
        """The text from the first policy token on (turns, tool answers and glue): what a scorer
        or a reward server rates, with the prompt's text as `src`."""
        first = next((i for i, s in enumerate(self.segments) if s.is_policy), len(self.segments))
        return "".join(s.text for s in self.segments[first:])

    @property
    def policy_segments(self):
        return [s for s in self.segments if s.is_policy]

    @property
    def num_turns(self):
        return len(self.policy_segments)

    @property
    def prompt_length(self):
        """Tokens before the first policy token (the trainers' prompt columns)."""
        n = 0
        for s in self.segments:
            if s.is_policy:
                return n
            n += len(s.token_ids)
        return n

    def policy_logprobs(self):
        """The engine's log-probs, one per token, 0.0 off the policy's tokens."""
        return np.asarray([lp for s in self.segments for lp in (s.logprobs or [0.0] * len(s.token_ids))], "float32")

    def turn_end_indices(self):
        """Index (in ``token_ids``) of the last token of each policy turn."""
        ends, n = [], 0
        for s in self.segments:
            n += len(s.token_ids)
            if s.is_policy and s.token_ids:
                ends.append(n - 1)
        return ends

    def as_record(self):
        """A JSON-able view for a samples file: each segment as `{"role", "text"}` (policy turns
        as "assistant", the prompt as "prompt", glue, tool answers and user turns by their kind),
        the rewards, why it ended and its tool calls."""
        turns = [{"role": "assistant" if s.is_policy else s.kind, "text": s.text} for s in self.segments]
        calls = [{k: v for k, v in c.items() if k not in ("start", "end")} for c in self.tool_calls]
        return {"turns": turns, "rewards": list(self.rewards), "stop_reason": self.stop_reason,
                "truncated": self.truncated, "tool_calls": calls}

    def reward_positions(self, mode="final"):
        """``[(token index, reward)]``: each turn's reward at its last token ("per_turn"), or their
        sum at the last policy token ("final")."""
        if mode not in TURN_REWARD_MODES:
            raise ValueError(f"turn_reward_mode must be one of {TURN_REWARD_MODES}, got {mode!r}")
        ends = self.turn_end_indices()
        if not ends:
            return []
        if mode == "final":
            return [(ends[-1], float(sum(self.rewards)))]
        return [(ends[k], float(r)) for k, r in enumerate(self.rewards[: len(ends)])]


def policy_mask(segments):
    """int8 `[num_tokens]`: 1 on the tokens of policy segments, 0 on everything the environment
    and the template fed. The only place this mask is made."""
    return np.concatenate([np.full(len(s.token_ids), 1 if s.is_policy else 0, np.int8) for s in segments]
                          or [np.zeros(0, np.int8)])


@dataclass
class TrajectoryBatch:
    """A batch of trajectories in the trainers' layout (numpy; B rows, Tp prompt and Tr response
    columns; the response starts at each row's first policy token)."""

    sequences: np.ndarray  # [B, Tp + Tr] int64: left-padded prompt, right-padded response
    attention_mask: np.ndarray  # [B, Tp + Tr] int64: 1 on every real token (policy and environment)
    response_mask: np.ndarray  # [B, Tr] float32: 1 on policy tokens only (policy_mask): losses, KL, entropy
    response_logprobs: np.ndarray  # [B, Tr] float32: the engine's log-probs, 0 off the policy's tokens
    response_lengths: np.ndarray  # [B] int64: real response tokens (every kind)
    rewards: np.ndarray  # [B, Tr] float32: the environment's rewards placed by turn_reward_mode
    last_policy_index: np.ndarray  # [B] int64: response column of the last policy token


def collate_trajectories(trajectories, pad_token_id, turn_reward_mode=TURN_REWARD_MODES[0]):
    """:class:`TrajectoryBatch` of `trajectories` (see the module docstring)."""
    prompts = [t.token_ids[: t.prompt_length] for t in trajectories]
    responses = [t.token_ids[t.prompt_length:] for t in trajectories]
    B = len(trajectories)
    Tp = max([len(p) for p in prompts] + [1])
    Tr = max([len(r) for r in responses] + [1])
    seq = np.full((B, Tp + Tr), pad_token_id, np.int64)
    attn = np.zeros((B, Tp + Tr), np.int64)
    mask = np.zeros((B, Tr), np.float32)
    lps = np.zeros((B, Tr), np.float32)
    rewards = np.zeros((B, Tr), np.float32)
    last = np.zeros(B, np.int64)
    for b, t in enumerate(trajectories):
        p, r, n = prompts[b], responses[b], t.prompt_length
        seq[b, Tp - len(p): Tp], seq[b, Tp: Tp + len(r)] = p, r
        attn[b, Tp - len(p): Tp + len(r)] = 1
        mask[b, : len(r)] = policy_mask(t.segments)[n:]
        lps[b, : len(r)] = t.policy_logprobs()[n:]
        for index, value in t.reward_positions(turn_reward_mode):
            rewards[b, index - n] += value
        ends = t.turn_end_indices()
        last[b] = ends[-1] - n if ends else 0
    lengths = np.asarray([len(r) for r in responses], np.int64)
    return TrajectoryBatch(seq, attn, mask, lps, lengths, rewards, last)


@dataclass
class Drift:
    """Where the ids a trajectory holds and the tokenizer's ids of its final text part."""

    position: int
    held: List[int]
    retokenized: List[int]

    def __str__(self):
        return f"token {self.position}: held {self.held} vs re-tokenised {self.retokenized}"


def tokenization_drift(trajectory, encode, window=6):
    """None when ``encode(trajectory.text)`` (the whole conversation tokenised at once) equals
    the ids the trajectory holds; else the first difference (:class:`Drift`). ``encode`` maps a
    text to ids the way the prompt was encoded (special tokens included)."""
    held, fresh = trajectory.token_ids, list(encode(trajectory.text))
    if held == fresh:
        return None
    i = next((k for k, (a, b) in enumerate(zip(held, fresh)) if a != b), min(len(held), len(fresh)))
    return Drift(i, held[i: i + window], fresh[i: i + window])
