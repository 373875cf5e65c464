"""Model-side pieces of a PPO step: forward passes that turn a rollout into
log-probs, values and scores. The math on top of them lives in `ppo/algos/`.

Layout: `sequences [N, T]` = left-padded prompt `[N, Tp]` + right-padded
response `[N, Tr]`; response token j sits at column `Tp + j` and is predicted
by the logits at column `Tp + j - 1`.

An `Experience` says which stage it is in (`stage`): "rollout" (sequences and masks, made in
`ppo.trainer.rollout`), "scored" (every objective's scores, `ppo.trainer.scoring`),
"complete" (old/reference log-probs, values, rewards and advantages, set together by
`ppo.trainer.advantages.AdvantageStage.complete`); the update takes only complete experiences.

The package: `stages` (the `Experience`, its traces and row operations) and `forward` (the
forward passes); import either from here.
"""
from .forward import in_chunks, response_logprobs, response_slice, response_values
from .stages import (
    LOSS_FIELDS,
    ROW_LISTS,
    ROW_TENSORS,
    STAGES,
    Experience,
    ObjectiveTrace,
    experience_from_rollout,
    loss_view,
    merge_rows,
    pad_columns,
    pad_experience,
)

__all__ = ["Experience", "LOSS_FIELDS", "ObjectiveTrace", "ROW_LISTS", "ROW_TENSORS", "STAGES", "experience_from_rollout",
           "in_chunks", "loss_view", "merge_rows", "pad_columns", "pad_experience", "response_logprobs", "response_slice",
           "response_values"]
