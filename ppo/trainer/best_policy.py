"""Best-policy selection on the evaluation set (PaddleNLP's `load_best_model_at_end`,
`metric_for_best_model`, `greater_is_better`): after each evaluation the actor's weights are
kept in host memory when the metric improved, and put back into the actor when training
ends, so `policy/` holds the best evaluated policy instead of the last one. `EvalEarlyStop`
stops the run when that metric stops improving (PaddleNLP's `early_stopping`)."""
import logging

import numpy as np

from ..early_stopping import EarlyStopping

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


class EvalEarlyStop:
    """PaddleNLP's `early_stopping` (its `EarlyStoppingCallback`) on `metric` (a name of
    `EVAL_METRICS`): `observe(step, metrics)` feeds each evaluation after a training step to
    `ppo.early_stopping.EarlyStopping` and says whether the run stops there. Its count is a
    checkpoint part, so a resumed run counts on."""

    def __init__(self, metric, greater_is_better, patience, threshold):
        self.metric, self.rule, self.stopped = metric, EarlyStopping(patience, threshold, greater_is_better), None

    def observe(self, step, metrics):
        """Whether training stops after the evaluation at `step` that gave `metrics`. Raises
        KeyError naming the metric when the evaluation lacks it."""
        if self.metric not in metrics:
            raise KeyError(f"metric_for_best_model {self.metric!r} is not among the evaluation's metrics {sorted(metrics)}")
        value = float(metrics[self.metric])
        if not self.rule.observe(value):
            return False
        r = self.rule
        self.stopped = {"step": step, "metric": self.metric, "value": value, "best": r.best, "patience": r.patience,
                        "threshold": r.threshold}
        logger.info(f"early stopping at step {step}: {self.metric} {value:.4f} has not improved on {r.best:.4f} by more "
                    f"than {r.threshold} for {r.patience} evaluations")
        return True

    def state_dict(self):
        return self.rule.state_dict()

    def set_state_dict(self, state):
        self.rule.set_state_dict(state)

    def summary(self):
        """`{"early_stopped": {...}}` for `summary.json` once it stopped the run, else empty."""
        return {"early_stopped": self.stopped} if self.stopped is not None else {}
