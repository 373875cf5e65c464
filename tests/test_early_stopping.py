"""ppo.evaluation.early_stopping against PaddleNLP's EarlyStoppingCallback (the same metric sequences give
the same stopping evaluation) and hand-worked sequences."""
import types

import pytest

from ppo.evaluation.early_stopping import EarlyStopping


def stop_index(values, **kwargs):
    stopper = EarlyStopping(**kwargs)
    for i, v in enumerate(values):
        if stopper.observe(v):
            return i
    return None


def test_hand_worked_sequences():
    """patience 2, threshold 0.05, higher is better: 0.5 (first: improvement), 0.52 (better by 0.02, not
    > 0.05: count 1; best 0.52), 0.6 (better by 0.08: reset), 0.6 (count 1), 0.58 (count 2: stop at index 4)."""
    assert stop_index([0.5, 0.52, 0.6, 0.6, 0.58], patience=2, threshold=0.05) == 4
    # lower is better (a loss): 1.0, 0.9 (reset), 0.95 (1), 0.92 (2 -> stop at index 3)
    assert stop_index([1.0, 0.9, 0.95, 0.92], patience=2, greater_is_better=False) == 3
    assert stop_index([0.1, 0.2, 0.3, 0.4], patience=1) is None  # always improving
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=0)


def test_state_round_trip():
    a = EarlyStopping(patience=3)
    for v in (0.5, 0.4):
        a.observe(v)
    b = EarlyStopping(patience=3)
    b.set_state_dict(a.state_dict())
    assert [a.observe(v) for v in (0.3, 0.2)] == [b.observe(v) for v in (0.3, 0.2)] == [False, True]


@pytest.mark.parametrize("greater", [True, False])
@pytest.mark.parametrize("threshold", [0.0, 0.05])
def test_same_stop_as_paddlenlp_callback(greater, threshold):
    """PaddleNLP's callback compares with the Trainer's best_metric, which the Trainer then moves to
    every better metric (load_best_model_at_end); fed the same metrics it stops at the same one."""
    import numpy as np
    from paddlenlp.trainer import EarlyStoppingCallback

    rng = np.random.default_rng(7 if greater else 8)
    values = [float(v) for v in np.round(rng.normal(size=40).cumsum() * 0.05, 3)]
    callback = EarlyStoppingCallback(early_stopping_patience=3, early_stopping_threshold=threshold)
    args = types.SimpleNamespace(metric_for_best_model="accuracy", greater_is_better=greater)
    state, control = types.SimpleNamespace(best_metric=None), types.SimpleNamespace(should_training_stop=False)
    theirs = None
    for i, v in enumerate(values):
        callback.on_evaluate(args, state, control, metrics={"eval_accuracy": v})
        if state.best_metric is None or (v > state.best_metric if greater else v < state.best_metric):
            state.best_metric = v  # what the Trainer's checkpoint save does with load_best_model_at_end
        if control.should_training_stop:
            theirs = i
            break
    assert theirs is not None  # the sequence does stop
    assert stop_index(values, patience=3, threshold=threshold, greater_is_better=greater) == theirs


def test_threshold_is_strict():
    """An improvement must beat the best by MORE than the threshold (PaddleNLP's
    `abs(metric - best) > threshold`): patience 1, threshold 0.5, metrics 1.0 then 1.5 (better
    by exactly 0.5, so not an improvement: count 1 = patience) stops at the second evaluation;
    1.0 then 1.51 does not."""
    assert stop_index([1.0, 1.5], patience=1, threshold=0.5) == 1
    assert stop_index([1.0, 1.51], patience=1, threshold=0.5) is None
    assert stop_index([1.0, 0.5], patience=1, threshold=0.5, greater_is_better=False) == 1
