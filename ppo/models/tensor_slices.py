"""How tensor parallelism slices one weight, as pure split / merge functions (no communication,
no models): the model classes' tensor-parallel layers (`ppo.models.parallel_layers`) hold these
slices, the rollout engine merges gathered ones (`ppo.rollout.weights`), and the tensor layout
reshards whole state dicts with them (`ppo.strategy.tensor.reshard`).

PaddleNLP cuts a Llama / Qwen2 checkpoint for tensor parallelism by its
``_get_tensor_parallel_mappings``; every weight is of one kind:

* ``column``: split along the last axis (q/k/v, gate, up, a fused qkv stored per key-value
  head, an untied LM head ``[H, V]``, their biases); rank r keeps block r;
* ``row``: split along axis 0 (o_proj, down_proj ``[in, out]``; the embedding and a tied LM
  head ``[V, H]``: the vocabulary);
* ``column_2fuse``: a fused gate-up ``[H, 2I]``: rank r keeps ``[gate_r, up_r]`` (PaddleNLP's
  ``is_naive_2fuse``), so merging is not a plain concatenation;
* ``replicated``: everything else (norms, score heads), the same on every rank.

`split` / `merge` work on numpy arrays and on Paddle tensors; ``merge(split(w, k, n), k) == w``
for every kind and degree.
"""
import copy

import numpy as np
import paddle

KINDS = ("column", "row", "column_2fuse", "replicated")


def _axis(weight, kind):
    return weight.ndim - 1 if kind in ("column", "column_2fuse") else 0


def _split_n(weight, parts, axis):
    if isinstance(weight, np.ndarray):
        return np.split(weight, parts, axis=axis)
    return paddle.split(weight, parts, axis=axis)


def _concat(parts, axis):
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=axis)
    return paddle.concat(parts, axis=axis)


def _check_kind(kind, name):
    if kind not in KINDS:
        raise ValueError(f"{name}: unknown tensor-parallel kind {kind!r}; one of {KINDS}")


def split(weight, kind, degree, name="weight"):
    """The ``degree`` shards of a full ``weight`` (list, rank order)."""
    _check_kind(kind, name)
    if degree < 1:
        raise ValueError(f"{name}: tensor-parallel degree must be >= 1, got {degree}")
    if kind == "replicated" or degree == 1:
        return [weight] * degree if kind == "replicated" else [weight]
    axis = _axis(weight, kind)
    parts = 2 * degree if kind == "column_2fuse" else degree
    size = int(weight.shape[axis])
    if size % parts:
        raise ValueError(f"{name}: axis {axis} of shape {list(weight.shape)} does not divide into {parts} equal parts "
                         f"({kind}, degree {degree})")
    blocks = _split_n(weight, parts, axis)
    if kind == "column_2fuse":  # [g1..gn, u1..un] -> rank r: [g_r, u_r]
        return [_concat([blocks[r], blocks[degree + r]], axis) for r in range(degree)]
    return blocks


def merge(shards, kind, name="weight"):
    """The full weight from its shards (rank order); inverse of `split`."""
    _check_kind(kind, name)
    if not shards:
        raise ValueError(f"{name}: no shards to merge")
    shapes = {tuple(int(d) for d in s.shape) for s in shards}
    if len(shapes) != 1:
        raise ValueError(f"{name}: shards of different shapes {sorted(shapes)} cannot be merged")
    if kind == "replicated" or len(shards) == 1:
        return shards[0]
    axis = _axis(shards[0], kind)
    if kind == "column_2fuse":  # rank r: [g_r, u_r] -> [g1..gn, u1..un]
        halves = [_split_n(s, 2, axis) for s in shards]
        return _concat([h[0] for h in halves] + [h[1] for h in halves], axis)
    return _concat(list(shards), axis)


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
            raise NotImplementedError(f"{name}: PaddleNLP's {kw} layout is not handled here")
        kinds[name] = "column_2fuse" if kw.get("is_naive_2fuse") else ("column" if kw.get("is_column", True) else "row")
    return kinds
