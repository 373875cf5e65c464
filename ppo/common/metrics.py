"""Metric accumulation and the one place where metrics are reduced across ranks.

A metric's reduction is named by its name: names ending in `max` reduce with max,
names ending in `min` with min, everything else with mean. No pairing of metrics
and reductions by list position.
"""
from collections import defaultdict

import numpy as np

from .training_world import training_group, training_world_size


def reduction_of(name):
    leaf = name.rsplit("/", 1)[-1]
    if leaf.endswith("max"):
        return "max"
    if leaf.endswith("min"):
        return "min"
    return "mean"


class MetricAccumulator:
    """Collects scalar values per name over one step (micro-batches, epochs)."""

    def __init__(self):
        self.values = defaultdict(list)

    def add(self, stats):
        """Add a dict of name -> scalar (python number or one-element tensor)."""
        for name, value in stats.items():
            self.values[name].append(value)

    def local_result(self):
        """Per-name local reduction as python floats (one host sync for all tensors)."""
        out = {}
        for name, values in self.values.items():
            arr = np.array([float(v.numpy().reshape(-1)[0]) if hasattr(v, "numpy") else float(v) for v in values])
            kind = reduction_of(name)
            out[name] = float(arr.max() if kind == "max" else arr.min() if kind == "min" else arr.mean())
        return out


def reduce_across_ranks(metrics, group=None):
    """All-reduce a name -> float dict with each name's reduction over `group` (default: the
    trainer ranks, `training_group`); identity on one rank.

    Every rank must pass the same names (sorted here so the order agrees).
    """
    import paddle
    import paddle.distributed as dist

    if group is None:
        if training_world_size() <= 1:  # a split run's rollout ranks are not in it
            return dict(metrics)
        group = training_group()
    names = sorted(metrics)
    out = {}
    for kind, op in (("mean", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)):
        selected = [n for n in names if reduction_of(n) == kind]
        if not selected:
            continue
        t = paddle.to_tensor([metrics[n] for n in selected], dtype="float64")
        dist.all_reduce(t, op=op, group=group)
        values = t.numpy()
        if kind == "mean":
            values = values / dist.get_world_size(group)
        out.update({n: float(v) for n, v in zip(selected, values)})
    return out
