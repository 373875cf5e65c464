"""A reward model whose tokenizer is not the actor's.

The reward model reads token ids; when its tokenizer maps text to other ids than the actor's
(even with the same vocabulary size), scoring the actor's ids scores other text. At start the
tokenizers are compared (vocabulary and special tokens); when they differ, each rollout is
re-tokenised for the reward model: the actor's prompt and response are decoded to text and
encoded with the reward model's tokenizer, as PaddleNLP's RLHF trainer (`batch_retokenize`) and
safe-rlhf's `PPOTrainer` do. The critic gives one value per actor token, so it cannot be
re-tokenised: a critic with another tokenizer is refused.
"""
import logging

import numpy as np
import paddle

from .causal_lm import position_ids_from_mask

logger = logging.getLogger("ppo")

SPECIAL_TOKENS = ("bos", "eos", "pad", "unk")


def tokenizer_differences(actor_tokenizer, other_tokenizer, limit=3):
    """How `other_tokenizer` differs from `actor_tokenizer`: a list of messages (empty when they
    map every token to the same id and share their special tokens)."""
    found = []
    mine, theirs = actor_tokenizer.get_vocab(), other_tokenizer.get_vocab()
    if len(mine) != len(theirs):
        found.append(f"vocabulary size {len(mine)} vs {len(theirs)}")
    moved = sorted(t for t, i in mine.items() if theirs.get(t) != i)
    if moved:
        examples = ", ".join(f"{t!r} is {mine[t]} vs {theirs.get(t)}" for t in moved[:limit])
        found.append(f"{len(moved)} of {len(mine)} tokens have other ids (e.g. {examples})")
    for name in SPECIAL_TOKENS:
        a = (getattr(actor_tokenizer, f"{name}_token", None), getattr(actor_tokenizer, f"{name}_token_id", None))
        b = (getattr(other_tokenizer, f"{name}_token", None), getattr(other_tokenizer, f"{name}_token_id", None))
        if a != b:
            found.append(f"{name} token {a[0]!r} (id {a[1]}) vs {b[0]!r} (id {b[1]})")
    return found


class RewardRetokenizer:
    """Re-encodes rollouts with the reward model's tokenizer (see the module docstring)."""

    def __init__(self, actor_tokenizer, reward_tokenizer):
        self.actor_tokenizer, self.reward_tokenizer = actor_tokenizer, reward_tokenizer
        if reward_tokenizer.pad_token_id is None:
            raise ValueError("the reward model's tokenizer has no pad token; set pad_token in its tokenizer_config.json")

    def texts(self, exp):
        """`prompt + response` texts of `exp`'s N rows (special tokens dropped)."""
        ids, mask = exp.response_ids.numpy(), exp.response_mask.numpy()
        responses = [self.actor_tokenizer.decode([t for t, m in zip(row, m_row) if m > 0], skip_special_tokens=True)
                     for row, m_row in zip(ids.tolist(), mask.tolist())]
        return [p + r for p, r in zip(exp.prompt_text, responses)]

    def encode(self, exp):
        """`(input_ids [N, T], attention_mask [N, T], position_ids [N, T])` int64, right-padded, for
        the reward model: each row is the reward tokenizer's encoding of prompt + response,
        followed by its EOS when the actor's response ended with EOS."""
        eos = self.reward_tokenizer.eos_token_id
        ended = exp.ends_with_eos.numpy().tolist() if exp.ends_with_eos is not None else [False] * len(exp.prompt_text)
        rows = []
        for text, stop in zip(self.texts(exp), ended):
            ids = list(self.reward_tokenizer(text)["input_ids"])
            rows.append(ids + [eos] if stop and eos is not None else ids)
        width = max(len(r) for r in rows)
        input_ids = np.full([len(rows), width], self.reward_tokenizer.pad_token_id, dtype="int64")
        mask = np.zeros([len(rows), width], dtype="int64")
        for i, row in enumerate(rows):
            input_ids[i, : len(row)], mask[i, : len(row)] = row, 1
        attention_mask = paddle.to_tensor(mask)
        return paddle.to_tensor(input_ids), attention_mask, position_ids_from_mask(attention_mask)


def reward_scores(reward_model, exp, retokenizer=None):
    """End scores `[N]` (float32) of `exp`'s sequences under `reward_model`; re-tokenised first
    when `retokenizer` (a RewardRetokenizer) is given."""
    if retokenizer is None:
        input_ids, attention_mask, position_ids = exp.sequences, exp.attention_mask, exp.position_ids
    else:
        input_ids, attention_mask, position_ids = retokenizer.encode(exp)
    out = reward_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return out.end_scores.astype("float32")


def reward_retokenizer_for(actor_tokenizer, reward_tokenizer, critic_tokenizer=None, pipeline=False):
    """A RewardRetokenizer when the reward model's tokenizer differs from the actor's (logged
    once with the differences), else None. Raises ValueError naming the differences when the
    critic's tokenizer differs (per-token values need the actor's tokens), or when the reward
    model's differs under pipeline parallelism (its stages take the actor's ids)."""
    if critic_tokenizer is not None:
        critic_diff = tokenizer_differences(actor_tokenizer, critic_tokenizer)
        if critic_diff:
            raise ValueError(
                "the critic's tokenizer differs from the actor's (" + "; ".join(critic_diff) + "); the critic "
                "scores every actor token, so start it from a model with the actor's tokenizer "
                "(reward_critic_model_name_or_path)"
            )
    differences = tokenizer_differences(actor_tokenizer, reward_tokenizer)
    if not differences:
        return None
    if pipeline:
        raise ValueError("the reward model's tokenizer differs from the actor's (" + "; ".join(differences)
                         + "); re-tokenising is not supported under pipeline_parallel_degree > 1")
    logger.warning("the reward model's tokenizer differs from the actor's (%s): every rollout is decoded and "
                   "re-tokenised for the reward model", "; ".join(differences))
    return RewardRetokenizer(actor_tokenizer, reward_tokenizer)


def retokenizer_for_run(model_args, use_critic, actor_tokenizer, pipeline=False):
    """`reward_retokenizer_for` with the tokenizers of a PPO run's reward model (none when the
    scores come from a server or rules) and critic (`reward_critic_model_name_or_path`, else
    the reward model's)."""
    from .loading import load_tokenizer

    external = model_args.use_rm_server or model_args.use_rule_reward
    reward_path = None if external else model_args.reward_model_name_or_path
    critic_path = (model_args.reward_critic_model_name_or_path or reward_path) if use_critic else None
    reward_tokenizer = load_tokenizer(reward_path) if reward_path else actor_tokenizer
    critic_tokenizer = load_tokenizer(critic_path) if critic_path else None
    return reward_retokenizer_for(actor_tokenizer, reward_tokenizer, critic_tokenizer, pipeline=pipeline)


def check_cost_tokenizers(model_args, actor_tokenizer):
    """PPO-Lagrangian's cost model and cost critic read the actor's token ids (no re-tokenising):
    raise ValueError naming the argument and the differences when a tokenizer is not the actor's."""
    from .loading import load_tokenizer

    for name in ("cost_model_name_or_path", "cost_critic_model_name_or_path"):
        path = getattr(model_args, name, None)
        differences = tokenizer_differences(actor_tokenizer, load_tokenizer(path)) if path else []
        if differences:
            raise ValueError(f"{name}={path}: its tokenizer differs from the actor's (" + "; ".join(differences)
                             + "); the cost model and cost critic need the actor's tokenizer")


MODEL_ROLES_ON_ACTOR_IDS = ("actor", "reference", "reward_critic", "cost", "cost_critic")
"""The models of a PPO run that read the actor's token ids (`<role>_model_name_or_path`)."""


def embedding_limit_problems(model_args, use_critic, actor_tokenizer, retokenizer, sequence_length,
                             what="max_prompt_len + max_dec_len"):
    """`startup_checks.token_and_position_problems` for every model of a PPO run (or online DPO)
    against the tokenizer that feeds it: the actor's for the actor, the reference, the critics
    and the cost model; the reward model's own when rollouts are re-tokenised for it
    (`retokenizer`), else the actor's. Read from the models' `config.json`, before they load.
    `what` names the arguments that set `sequence_length`."""
    from ..common.startup_checks import token_and_position_problems

    on_actor_ids = [(f"{role}_model_name_or_path", getattr(model_args, f"{role}_model_name_or_path", None))
                    for role in MODEL_ROLES_ON_ACTOR_IDS]
    reward_path = None if (model_args.use_rm_server or model_args.use_rule_reward) else model_args.reward_model_name_or_path
    if use_critic and not model_args.reward_critic_model_name_or_path and reward_path:
        on_actor_ids.append(("reward_model_name_or_path (the critic starts from it)", reward_path))
    problems = token_and_position_problems(actor_tokenizer, on_actor_ids, sequence_length, what)
    if reward_path:
        reward_tokenizer = retokenizer.reward_tokenizer if retokenizer is not None else actor_tokenizer
        problems += token_and_position_problems(reward_tokenizer, [("reward_model_name_or_path", reward_path)],
                                                sequence_length, what)
    return problems
