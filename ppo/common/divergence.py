"""Divergence detection: a watched metric jumping by an order of magnitude or more.

A learning rate far too high (say 1e3) destroys a model in a step or two while
the run goes on and exits 0: PPO's KL to the reference (or, within an update,
to the rollout policy) leaps from ~0 to tens of nats or more, a loss or gradient
norm from its usual size to 10-1000 times it. The
detector compares each new value with the median of the watched metric's recent
history:

    diverged  <=>  |x_t| > factor * max(median(|x_{t-w..t-1}|), floor)   or  x_t not finite

`floor` keeps metrics that sit near zero (the KL of an on-policy first step, a
whitened policy loss) from firing on harmless changes (0.001 -> 0.05). Values that
diverged do not enter the history, so a run that keeps diverging keeps firing.
Only values seen at least once before are judged (the first value of a metric
has no history to compare with).

Gradient norms (names ending in `grad_norm`) are measured before clipping, and the
clipped step they feed moves the weights by a bounded amount: one spike of them (a
critic meeting a few extreme returns, a k3 KL term meeting one rare sampled token) is
not divergence. They fire on a jump at the step after a jump; the optimiser steps of
one step (PPO's update epochs over one rollout batch) meet the same batch, so their
jumps count as one. A non-finite value, and every other metric, fires at once.
"""
import math
from collections import defaultdict, deque
from statistics import median

# Metric names watched in every trainer (those a trainer does not log are ignored).
WATCHED = (
    "objective/kl",
    "policy/approxkl_avg",
    "loss/policy_avg",
    "loss/value_avg",
    "train/actor_grad_norm",
    "train/critic_grad_norm",
    "train/grad_norm",
    "loss/sft",
    "loss/total",
    "rm/loss",
    "cost/loss",
)


class DivergenceError(RuntimeError):
    """The run was stopped because a watched metric diverged (`stop_on_divergence`)."""


class DivergenceDetector:
    """Judge each step's metrics against their recent history (see the module docstring)."""

    def __init__(self, factor=10.0, window=10, floor=1.0, watched=WATCHED):
        if factor <= 1 or window < 1 or floor < 0:
            raise ValueError(f"need factor > 1, window >= 1, floor >= 0; got {factor}, {window}, {floor}")
        self.factor, self.floor, self.watched = float(factor), float(floor), tuple(watched)
        self.history = defaultdict(lambda: deque(maxlen=window))
        self.jumped = {}  # clipped metric -> step of its pending jump (it fires on a jump at a later step)

    def check(self, step, metrics):
        """`{metric name: message}` for each watched metric in `metrics` (name -> number) that
        diverged at `step`; empty when none did. Non-diverged values join the history."""
        messages = {}
        for name in self.watched:
            if name not in metrics:
                continue
            value = float(metrics[name])
            past = self.history[name]
            if not math.isfinite(value):
                if past:
                    messages[name] = f"step {step}: {name} is {value} (recent median {median(past):.4g})"
                continue
            if past:
                baseline = max(median(past), self.floor)
                if abs(value) > self.factor * baseline:
                    if name.endswith("grad_norm") and self.jumped.setdefault(name, step) == step:
                        continue  # one clipped spike (or its batch again, in a later update epoch)
                    again = " for the second step in a row" if name.endswith("grad_norm") else ""
                    messages[name] = (
                        f"step {step}: {name} = {value:.4g}, {abs(value) / baseline:.3g}x its recent level "
                        f"{baseline:.4g} (threshold {self.factor:g}x){again}"
                    )
                    continue
            self.jumped.pop(name, None)
            past.append(abs(value))
        return messages

    def state_dict(self):
        return {name: list(values) for name, values in self.history.items()}

    def set_state_dict(self, state):
        for name, values in (state or {}).items():
            self.history[name].extend(values)
