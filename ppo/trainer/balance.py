"""`balance_batch` (PaddleNLP, verl): each step's rollout rows reordered over the data-parallel
ranks so that every rank gets a similar token count before the log-prob passes and the update.

The unit moved is a group (the `rollout_n` rows of one prompt), so that per-group estimators
(GRPO, RLOO) still find a whole group on one rank; every rank keeps the same number of groups,
so the optimiser plan is unchanged. The partition is greedy longest-first with equal part sizes
(PaddleNLP and verl use Karmarkar-Karp; the greedy one is within one group's tokens of the
best for these sizes and simpler to check by hand).
"""
import numpy as np
import paddle

from ..experience.stages import merge_rows
from ..models.causal_lm import position_ids_from_mask


def balanced_partition(lengths, parts):
    """Indices of `lengths` split into `parts` lists of equal size (`len(lengths) % parts == 0`)
    with similar sums: longest first, each to the part with the smallest sum that is not yet
    full (ties: the lower part). Each list is sorted."""
    n = len(lengths)
    if parts < 1 or n % parts:
        raise ValueError(f"{n} items do not split into {parts} equal parts")
    size = n // parts
    members, totals = [[] for _ in range(parts)], [0] * parts
    for i in sorted(range(n), key=lambda i: (-lengths[i], i)):
        j = min((p for p in range(parts) if len(members[p]) < size), key=lambda p: (totals[p], p))
        members[j].append(i)
        totals[j] += lengths[i]
    return [sorted(m) for m in members]


def imbalance(totals):
    """max / mean of per-rank token totals (1.0: perfectly even)."""
    totals = np.asarray(totals, dtype="float64")
    return float(totals.max() / max(totals.mean(), 1e-9))


def _to_host(exp):
    return exp.map_rows(lambda t: t.numpy(), list)


def _from_host(exp):
    return exp.map_rows(paddle.to_tensor, list)


def trim_padding(exp):
    """`exp` without prompt columns that are padding in every row (left) and response columns
    past the longest response (right)."""
    P = exp.prompt_len
    prompt_tokens = int(exp.attention_mask[:, :P].sum(axis=1).max())
    Tr = max(int(exp.response_mask.sum(axis=1).max()), 1)
    keep_p = max(prompt_tokens, 1)
    if keep_p == P and Tr == exp.response_ids.shape[1]:
        return exp
    out = exp.select(list(range(len(exp))))
    out.prompt_len = keep_p
    out.sequences = exp.sequences[:, P - keep_p : P + Tr]
    out.attention_mask = exp.attention_mask[:, P - keep_p : P + Tr]
    out.position_ids = position_ids_from_mask(out.attention_mask)
    for name in ("response_ids", "response_mask", "old_logprobs", "rollout_logprobs", "token_versions"):
        if getattr(exp, name) is not None:
            setattr(out, name, getattr(exp, name)[:, :Tr])
    if exp.routing is not None:
        out.routing = exp.routing[:, P - keep_p : P + Tr]
    return out


def balance_rows(exp, ranks, group_size, pad_token_id):
    """This data rank's share of every rank's rows after `balanced_partition` of the groups'
    token counts (prompt + response); `ranks`: the run's `Ranks`. Collective over all ranks (tensor- and pipeline-parallel
    copies of a data rank send the same rows; the first one counts). Returns the experience
    and `{"rollout/rank_token_imbalance", "rollout/rank_token_imbalance_before"}`."""
    data_rank, data_world = ranks.data_rank, ranks.data_world
    gathered = ranks.gather_objects((data_rank, _to_host(exp)))
    by_rank = {}
    for rank, fields in gathered:
        by_rank.setdefault(rank, fields)
    parts = [_from_host(by_rank[r]) for r in range(data_world)]
    before = [int(p.attention_mask.sum()) for p in parts]
    merged = merge_rows(parts, pad_token_id)
    row_tokens = merged.attention_mask.sum(axis=1).numpy()
    group_tokens = row_tokens.reshape(-1, group_size).sum(axis=1).tolist()
    partition = balanced_partition(group_tokens, data_world)
    after = [sum(group_tokens[g] for g in part) for part in partition]
    rows = [g * group_size + j for g in partition[data_rank] for j in range(group_size)]
    stats = {"rollout/rank_token_imbalance": imbalance(after), "rollout/rank_token_imbalance_before": imbalance(before)}
    return trim_padding(merged.select(rows)), stats
