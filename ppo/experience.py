"""Model-side pieces of a PPO step: forward passes that turn a rollout into
log-probs, values and scores. The math on top of them lives in `ppo/algos/`.

Layout: `sequences [N, T]` = left-padded prompt `[N, Tp]` + right-padded
response `[N, Tr]`; response token j sits at column `Tp + j` and is predicted
by the logits at column `Tp + j - 1`.

An `Experience` says which stage it is in (`stage`): "rollout" (sequences and masks),
"scored" (`scores` set), "complete" (old/reference log-probs, values, rewards and
advantages set together by `PPOTrainer.compute_advantages`); the update takes only
complete experiences.
"""
from dataclasses import dataclass, fields
from typing import List, Optional

import numpy as np
import paddle

from .models.causal_lm import DEFAULT_LOGPROB_CHUNK_SIZE, causal_lm_token_logprobs, last_token_index, position_ids_from_mask
from .models.unpadded import pack_padded, packed_token_logprobs

STAGES = ("rollout", "scored", "complete")


@dataclass
class Experience:
    """One rollout batch and everything computed from it; tensors have `N` rows."""

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
    values: Optional[paddle.Tensor] = None  # [N, Tr]
    scores: Optional[paddle.Tensor] = None  # [N] raw scores (before normalisation)
    rewards: Optional[paddle.Tensor] = None  # [N, Tr] shaped token rewards
    advantages: Optional[paddle.Tensor] = None  # [N, Tr]
    returns: Optional[paddle.Tensor] = None  # [N, Tr]
    ends_with_eos: Optional[paddle.Tensor] = None  # [N] bool
    # PPO-Lagrangian (a cost model): `advantages` is then the combined one the actor trains on
    costs: Optional[paddle.Tensor] = None  # [N] raw cost-model scores
    cost_values: Optional[paddle.Tensor] = None  # [N, Tr] cost critic
    cost_rewards: Optional[paddle.Tensor] = None  # [N, Tr] shaped token costs
    cost_advantages: Optional[paddle.Tensor] = None  # [N, Tr]
    cost_returns: Optional[paddle.Tensor] = None  # [N, Tr]
    stage: str = "rollout"  # one of STAGES

    def __len__(self):
        return self.sequences.shape[0]

    def select(self, index):
        """The rows `index` (a list or array of ints) as a new `Experience`."""
        idx = paddle.to_tensor(np.asarray(index, dtype="int64"))
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, paddle.Tensor):
                picked[f.name] = paddle.index_select(value, idx, axis=0)
            elif isinstance(value, list):
                picked[f.name] = [value[i] for i in index]
            else:
                picked[f.name] = value
        return Experience(**picked)

    @staticmethod
    def concat(parts):
        """Rows of several experiences with the same prompt and response widths."""
        first = parts[0]
        merged = {}
        for f in fields(first):
            values = [getattr(p, f.name) for p in parts]
            if isinstance(values[0], paddle.Tensor):
                merged[f.name] = paddle.concat(values, axis=0)
            elif isinstance(values[0], list):
                merged[f.name] = [v for vs in values for v in vs]
            else:
                merged[f.name] = values[0]
        return Experience(**merged)

    def advance(self, stage):
        """Mark the experience as having reached `stage`, checking the fields it needs."""
        needed = {"scored": ("scores",), "complete": ("scores", "old_logprobs", "ref_logprobs", "rewards", "advantages")}
        missing = [name for name in needed.get(stage, ()) if getattr(self, name) is None]
        if stage not in STAGES or missing:
            raise ValueError(f"experience cannot reach stage {stage!r}: missing {missing or 'a known stage name'}")
        self.stage = stage
        return self

    def require(self, stage):
        """Raise unless the experience has reached `stage`."""
        if STAGES.index(self.stage) < STAGES.index(stage):
            raise RuntimeError(f"this step needs a {stage!r} experience, got one at stage {self.stage!r}")


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


def response_slice(tensor, prompt_len, response_len):
    """Columns predicting the response: `[N, T, ...]` -> `[N, Tr, ...]`."""
    return tensor[:, prompt_len - 1 : prompt_len - 1 + response_len]


def response_logprobs(model, exp, temperature, chunk_size=DEFAULT_LOGPROB_CHUNK_SIZE, with_entropy=False,
                      remove_padding=False):
    """Log-probs `[N, Tr]` of the response tokens under `model` at `temperature` and, with
    `with_entropy`, the entropy `[N, Tr]` of each predicting distribution (else None); both 0
    outside the response mask. The LM head runs over response tokens only, `chunk_size` at a
    time (0: full logits). `remove_padding`: the model runs on the rows' real tokens packed
    together (`ppo.models.unpadded`), with the same results."""
    P = exp.prompt_len
    mask = paddle.concat([paddle.zeros([len(exp), P], "float32"), exp.response_mask.astype("float32")], axis=1)
    Tr = exp.response_ids.shape[1]
    if remove_padding:
        packed = pack_padded(exp.sequences, exp.attention_mask)
        logprobs, entropy = packed_token_logprobs(model, packed, mask, temperature, chunk_size, with_entropy)
        return logprobs[:, P:P + Tr], (entropy[:, P:P + Tr] if with_entropy else None)
    logprobs, entropy = causal_lm_token_logprobs(
        model, exp.sequences, exp.attention_mask, exp.sequences, mask=mask, position_ids=exp.position_ids,
        temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy, first_counted=P,
    )
    return response_slice(logprobs, P, Tr), (response_slice(entropy, P, Tr) if with_entropy else None)


def response_values(critic, exp, remove_padding=False):
    """Critic values `[N, Tr]`: the value of the state before each response token.
    `remove_padding`: the critic runs on the rows' real tokens packed together."""
    if remove_padding:
        packed = pack_padded(exp.sequences, exp.attention_mask)
        out = critic(input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=packed.position_ids,
                     ends=packed.ends)
        scores = packed.to_padded(out.scores)
    else:
        scores = critic(input_ids=exp.sequences, attention_mask=exp.attention_mask, position_ids=exp.position_ids).scores
    return response_slice(scores, exp.prompt_len, exp.response_ids.shape[1]) * exp.response_mask


def reward_model_scores(reward_model, exp):
    """End scores `[N]` of the full sequences under a score model."""
    out = reward_model(input_ids=exp.sequences, attention_mask=exp.attention_mask, position_ids=exp.position_ids)
    return out.end_scores.astype("float32")


def in_chunks(fn, exp, chunk_size):
    """Apply `fn(sub_experience)` to row chunks of `exp` and concatenate the outputs."""
    n = len(exp)
    if n <= chunk_size:
        return fn(exp)
    outs = [fn(exp.select(list(range(s, min(s + chunk_size, n))))) for s in range(0, n, chunk_size)]
    return paddle.concat(outs, axis=0)


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
    if exp.old_logprobs is not None:
        out.old_logprobs = pad_columns(exp.old_logprobs, 0, dr, 0.0)
    return out


def merge_rows(parts, pad_id):
    """Concatenate experiences whose prompt/response widths may differ."""
    Tp = max(p.prompt_len for p in parts)
    Tr = max(p.response_ids.shape[1] for p in parts)
    return Experience.concat([pad_experience(p, Tp, Tr, pad_id) for p in parts])
