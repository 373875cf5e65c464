"""Early stopping on the evaluation metric with PaddleNLP's meaning (`EarlyStoppingCallback` of
`paddlenlp.trainer.trainer_callback`, which PaddleNLP's `run_rl.py` adds with `early_stopping`).

After each evaluation the metric (`metric_for_best_model`) is compared with the best value of the
earlier evaluations: it counts as an improvement when it is better (`greater_is_better`) AND
differs from that best by more than `early_stopping_threshold`; an improvement resets the count
of evaluations without one, anything else adds one, and training stops when the count reaches
`early_stopping_patience`. The best value itself follows every strictly better metric, whatever
the threshold (as the Trainer's `best_metric` does). The first evaluation always counts as an
improvement.

Pure logic (no model, no I/O): the PPO loop feeds it each evaluation's metric.
"""

__all__ = ["EarlyStopping"]


class EarlyStopping:
    """`observe(value) -> bool`: whether training stops after the evaluation that gave `value`."""

    def __init__(self, patience, threshold=0.0, greater_is_better=True):
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.patience, self.threshold, self.greater_is_better = patience, threshold, greater_is_better
        self.best, self.waited = None, 0

    def better(self, value):
        return value > self.best if self.greater_is_better else value < self.best

    def observe(self, value):
        value = float(value)
        if self.best is None or (self.better(value) and abs(value - self.best) > self.threshold):
            self.waited = 0
        else:
            self.waited += 1
        if self.best is None or self.better(value):
            self.best = value
        return self.waited >= self.patience

    def state_dict(self):
        """What a checkpoint keeps, so that a resumed run counts on."""
        return {"best": self.best, "waited": self.waited}

    def set_state_dict(self, state):
        self.best, self.waited = state.get("best"), int(state.get("waited", 0))
