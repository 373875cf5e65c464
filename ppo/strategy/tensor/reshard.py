"""Resharding whole state dicts between tensor-parallel degrees (no communication, no models).

Every weight is of one kind (``column``, ``row``, ``column_2fuse``, ``replicated``), whose
`split` / `merge` live with the model classes' tensor-parallel layers
(`ppo.models.tensor_slices`, re-exported here), as does `tensor_parallel_kinds`, the kinds the
model class's own mappings give; `split_state_dict` / `merge_state_dicts` / `reshard_state_dicts`
apply them to whole state dicts.
"""
from ...models.tensor_slices import KINDS, merge, split, tensor_parallel_kinds

__all__ = ["KINDS", "merge", "merge_state_dicts", "reshard", "reshard_state_dicts", "split", "split_state_dict",
           "tensor_parallel_kinds"]


def reshard(shards, kind, to_degree, name="weight"):
    """Shards of one layout (``len(shards)`` ranks) as shards of ``to_degree`` ranks."""
    return split(merge(shards, kind, name), kind, to_degree, name)


def split_state_dict(state, kinds, degree):
    """A full state dict as ``degree`` per-rank state dicts."""
    missing = [k for k in state if k not in kinds]
    if missing:
        raise KeyError(f"no tensor-parallel kind for {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    per_rank = [dict() for _ in range(degree)]
    for name, weight in state.items():
        for r, shard in enumerate(split(weight, kinds[name], degree, name)):
            per_rank[r][name] = shard
    return per_rank


def merge_state_dicts(states, kinds):
    """Per-rank state dicts (rank order) as one full state dict."""
    names = list(states[0])
    for r, s in enumerate(states[1:], 1):
        if list(s) != names:
            raise KeyError(f"rank {r}'s state dict has other keys than rank 0's: {sorted(set(s) ^ set(names))[:3]}")
    return {name: merge([s[name] for s in states], kinds[name], name) for name in names}


def reshard_state_dicts(states, kinds, to_degree):
    """Per-rank state dicts of one tensor-parallel degree as those of ``to_degree``."""
    return split_state_dict(merge_state_dicts(states, kinds), kinds, to_degree)
