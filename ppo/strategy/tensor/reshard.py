"""Resharding whole state dicts between tensor-parallel degrees (no communication, no models).

Every weight is of one kind (``column``, ``row``, ``column_2fuse``, ``replicated``), whose
`split` / `merge` live with the model classes' tensor-parallel layers
(`ppo.models.tensor_slices`, re-exported here). `tensor_parallel_kinds` reads the kinds from the
model class's own mappings; `split_state_dict` / `merge_state_dicts` / `reshard_state_dicts`
apply them to whole state dicts.
"""
import copy

from ...models.tensor_slices import KINDS, merge, split

__all__ = ["KINDS", "merge", "merge_state_dicts", "reshard", "reshard_state_dicts", "split", "split_state_dict",
           "tensor_parallel_kinds"]


def reshard(shards, kind, to_degree, name="weight"):
    """Shards of one layout (``len(shards)`` ranks) as shards of ``to_degree`` ranks."""
    return split(merge(shards, kind, name), kind, to_degree, name)


def tensor_parallel_kinds(model_class, config, names, degree=2):
    """``{name: kind}`` for the state-dict keys ``names`` of a ``model_class`` model (a PaddleNLP
    class with ``_get_tensor_parallel_mappings``), from those mappings at ``degree`` (a key the
    mappings do not cut is replicated: k/v with fewer key-value heads than ranks, a vocabulary
    the degree does not divide). Keys may carry a prefix (``llama.``, ``model.``)."""
    probe = copy.deepcopy(config)  # from_dict(to_dict()) would drop LlamaConfig's fuse_* switches
    probe.tensor_parallel_degree, probe.tensor_parallel_rank = degree, 0
    actions = model_class._get_tensor_parallel_mappings(probe, is_split=True)
    kinds = {}
    for name in names:
        action = next((a for key, a in actions.items() if name == key or name.endswith("." + key)), None)
        if action is None:
            kinds[name] = "replicated"
            continue
        kw = getattr(action, "keywords", {}) or {}
        if kw.get("is_naive_3fuse") or kw.get("is_old_qkv") or kw.get("transpose"):
            raise NotImplementedError(f"{name}: PaddleNLP's {kw} layout is not handled by reshard")
        kinds[name] = "column_2fuse" if kw.get("is_naive_2fuse") else ("column" if kw.get("is_column", True) else "row")
    return kinds


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
