"""Best-policy selection on the evaluation set (PaddleNLP's `load_best_model_at_end`,
`metric_for_best_model`, `greater_is_better`): after each evaluation the actor's weights are
kept in host memory when the metric improved, and put back into the actor when training
ends, so `policy/` holds the best evaluated policy instead of the last one."""
import logging

import numpy as np

logger = logging.getLogger("ppo")

EVAL_METRICS = ("eval/score", "eval/accuracy", "eval/accuracy_long", "eval/accuracy_short", "eval/response_length")
"""The metrics the PPO/GRPO evaluation reports (`eval/accuracy*` only with reference answers)."""


def eval_metric_name(name):
    """`metric_for_best_model` as the loop's metric name: `accuracy`, `eval_accuracy` and
    `eval/accuracy` all give `eval/accuracy` (PaddleNLP writes `eval_<name>`)."""
    bare = name[len("eval/"):] if name.startswith("eval/") else name[len("eval_"):] if name.startswith("eval_") else name
    return f"eval/{bare}"


def improves(value, best, greater_is_better):
    """Whether `value` beats `best` (None: nothing kept yet); ties keep the earlier policy."""
    if best is None:
        return True
    return value > best if greater_is_better else value < best


class BestPolicy:
    """The best evaluated actor weights so far. `metric`: a name of `EVAL_METRICS`."""

    def __init__(self, metric, greater_is_better=True):
        self.metric, self.greater_is_better = metric, greater_is_better
        self.best, self.step, self.weights = None, None, None

    def consider(self, step, metrics, model):
        """Keep a host copy of `model`'s weights when `metrics[self.metric]` improves; returns
        whether it did. Raises KeyError naming the metric when the evaluation lacks it."""
        if self.metric not in metrics:
            raise KeyError(f"metric_for_best_model {self.metric!r} is not among the evaluation's metrics {sorted(metrics)}")
        value = float(metrics[self.metric])
        if not improves(value, self.best, self.greater_is_better):
            return False
        self.best, self.step = value, step
        self.weights = {name: np.array(t.numpy(), copy=True) for name, t in model.state_dict().items()}
        return True

    def restore(self, model):
        """Put the kept weights back into `model`; returns the step they come from (None when
        nothing was kept)."""
        if self.weights is None:
            return None
        model.set_state_dict(self.weights)
        logger.info(f"best policy: step {self.step} ({self.metric} {self.best:.4f}) restored for the final save")
        return self.step

    def summary(self):
        """`{"best_policy": {...}}` for `summary.json` (empty when nothing was kept)."""
        if self.step is None:
            return {}
        return {"best_policy": {"step": self.step, "metric": self.metric, "value": self.best}}
