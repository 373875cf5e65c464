"""Best-policy selection on the evaluation set (PaddleNLP's `load_best_model_at_end`,
`metric_for_best_model`, `greater_is_better`): after each evaluation the actor's weights are
kept in host memory when the metric improved, and put back into the actor when training
ends, so `policy/` holds the best evaluated policy instead of the last one. `EvalEarlyStop`
stops the run when that metric stops improving (PaddleNLP's `early_stopping`).

Both count every evaluation of the run, the one of step 0 (the starting policy) included: the
best policy may be the starting one, and early stopping stops when `patience` evaluations after
training have not beaten the best so far, the starting policy's included. (PaddleNLP's Trainer
evaluates no step 0, so there the question does not arise.) Both are checkpoint parts: the
record (`trainer_state.json`) and the kept weights (`best_policy.rank<r>.npz` beside it) survive
a resume, so a resumed run never replaces the best policy with a worse one, and an early-stopped
run stays stopped."""
import logging
import os

import numpy as np

from ..evaluation.early_stopping import EarlyStopping

logger = logging.getLogger("ppo")

EVAL_METRICS = ("eval/score", "eval/accuracy", "eval/accuracy_long", "eval/accuracy_short", "eval/response_length",
                "eval/agent/success")
"""The metrics the PPO/GRPO evaluation reports (`eval/accuracy*` only with reference answers;
`eval/agent/success` of a multi-turn run, ppo/trainer/agent_eval.py)."""


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

    def state_dict(self):
        """The record a checkpoint keeps (`trainer_state.json`); the weights go to `save_files`."""
        return {"metric": self.metric, "step": self.step, "value": self.best}

    def set_state_dict(self, state):
        if state.get("metric") not in (None, self.metric):  # another metric's best is no best for this one
            logger.warning(f"the checkpoint's best policy was chosen on {state['metric']}, this run watches "
                           f"{self.metric}: choosing afresh")
            return
        self.step, self.best = state.get("step"), state.get("value")

    def save_files(self, directory, rank):
        """Write this rank's kept weights into the checkpoint being written at `directory`."""
        if self.weights is not None:
            np.savez(os.path.join(directory, f"best_policy.rank{rank}.npz"), **self.weights)

    def load_files(self, directory, rank):
        """Read this rank's kept weights back from the checkpoint `directory` (after
        `set_state_dict`). A record whose weights are missing is dropped with a warning."""
        file = os.path.join(directory, f"best_policy.rank{rank}.npz")
        if self.step is None:
            self.weights = None
        elif os.path.isfile(file):
            with np.load(file) as saved:
                self.weights = {name: saved[name] for name in saved.files}
        else:
            logger.warning(f"{directory} records the best policy of step {self.step} but holds no {os.path.basename(file)}: "
                           "choosing afresh from the next evaluation")
            self.step, self.best, self.weights = None, None, None


class EvalEarlyStop:
    """PaddleNLP's `early_stopping` (its `EarlyStoppingCallback`) on `metric` (a name of
    `EVAL_METRICS`): `observe(step, metrics)` feeds each evaluation (step 0's included) to
    `ppo.evaluation.early_stopping.EarlyStopping` and says whether the run stops there. Its count and
    where it stopped (`stopped`) are a checkpoint part, so a resumed run counts on and an
    early-stopped run is finished."""

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
        return {**self.rule.state_dict(), "stopped": self.stopped}

    def set_state_dict(self, state):
        self.rule.set_state_dict(state)
        self.stopped = state.get("stopped")

    def summary(self):
        """`{"early_stopped": {...}}` for `summary.json` once it stopped the run, else empty."""
        return {"early_stopped": self.stopped} if self.stopped is not None else {}
