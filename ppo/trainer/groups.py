"""Prompt groups of a rollout: `rollout_n` consecutive rows of one prompt, sharing a group id
that no other row of any rank holds (GRPO-style estimators and dynamic sampling read them)."""
import numpy as np


def split_groups(num_rows, group_size):
    """Row-index lists of the consecutive groups of `group_size` rows."""
    return [list(range(s, s + group_size)) for s in range(0, num_rows, group_size)]


def check_groups(exp, group_size, ranks, step):
    """Raise unless each group of `exp` is `group_size` consecutive rows of one prompt and no
    group id is on two data ranks (`ranks`: the run's `Ranks`; collective on several); returns
    the number of groups on this rank. `step`: the 1-based step, for the message."""
    ids = exp.group_ids.numpy().reshape(-1, group_size)
    prompts = exp.sequences[:, : exp.prompt_len].numpy().reshape(ids.shape[0], group_size, -1)
    if not (ids == ids[:, :1]).all() or not (prompts == prompts[:, :1]).all():
        raise RuntimeError(f"step {step}: a group is not {group_size} consecutive rows of one prompt")
    if ranks.world_size > 1:
        by_data_rank = {}
        for row in ranks.gather([ranks.data_rank, *ids[:, 0].tolist()], dtype="int64"):
            if by_data_rank.setdefault(int(row[0]), row[1:].tolist()) != row[1:].tolist():  # tensor-parallel copies agree
                raise RuntimeError(f"step {step}: tensor-parallel ranks of data rank {row[0]} hold different groups")
        all_ids = np.concatenate([np.asarray(v) for v in by_data_rank.values()])
        if len(np.unique(all_ids)) != len(all_ids):
            raise RuntimeError(f"step {step}: a group id appears on more than one rank")
    return ids.shape[0]
