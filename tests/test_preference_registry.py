"""The preference-loss registry: its facts, the table in docs/algorithms.md, the argument checks that read it,
and that no caller branches on a loss name."""
import ast
import math
import os
import types

import numpy as np
import paddle
import pytest

from dpo.preference_objective import loss_argument_problems, preference_objective, unused_hyperparameters
from ppo.algos import DATA_KINDS, PREFERENCE_HYPERPARAMETERS, PREFERENCE_LOSSES, PreferenceInputs, get_preference_loss
from tests.preference_shims import dpo_loss
from scripts.gen_loss_table import main as gen_loss_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLERS = ("dpo/dpo_trainer.py", "dpo/run_dpo.py", "dpo/preference_objective.py", "ppo/strategy/pipeline/preference_pipe.py")


def test_readme_loss_table_is_current():
    assert gen_loss_table(["--check"]) == 0, "run: python scripts/gen_loss_table.py"


@pytest.mark.parametrize("path", CALLERS)
def test_no_caller_compares_with_a_loss_name(path):
    """No comparison in a caller involves a registered loss_type (callers read facts); a name
    as a field default is fine."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    names = {c.value for n in compares for c in ast.walk(n) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    assert not names & set(PREFERENCE_LOSSES), (path, names & set(PREFERENCE_LOSSES))


def test_facts_are_consistent():
    assert set(DATA_KINDS) == {e.data for e in PREFERENCE_LOSSES.values()}
    for e in PREFERENCE_LOSSES.values():
        assert set(e.hyperparameters) <= set(PREFERENCE_HYPERPARAMETERS), e
        assert ("reference_free" in e.hyperparameters) == (e.reference == "optional"), e
        assert e.needs_reference(False) == (e.reference != "none")
        assert not e.needs_reference(True) or e.reference == "required"
    with pytest.raises(ValueError, match="valid choices"):
        get_preference_loss("dpo")


def synthetic_inputs(loss, rng, B=3, dtype="float64"):
    """Random inputs of `loss`'s data kind (with everything any loss may read)."""
    K = {"pairs": 2, "lists": 4, "unpaired": 1, "rejected": 1}[loss.data]
    t = lambda a: paddle.to_tensor(np.asarray(a, dtype))  # noqa: E731
    scores = {"lists": rng.integers(0, 3, (B, K)), "unpaired": rng.integers(0, 2, (B, 1))}.get(loss.data)
    return PreferenceInputs(
        t(rng.normal(size=(B, K)) - 8), reference=t(rng.normal(size=(B, K)) - 8), lengths=t(rng.integers(1, 9, (B, K))),
        scores=None if scores is None else t(scores), nll=t(1.5), kl_point=t(0.2),
    )


@pytest.mark.parametrize("name", list(PREFERENCE_LOSSES))
def test_every_loss_runs_with_one_signature(name):
    loss = PREFERENCE_LOSSES[name]
    x = synthetic_inputs(loss, np.random.default_rng(0))
    x.policy.stop_gradient = False
    value, stats = loss(x, {})
    assert value.shape == [] and math.isfinite(float(value))
    value.backward()
    assert x.policy.grad is not None and np.isfinite(x.policy.grad.numpy()).all()
    assert "rewards/rejected" in stats and all(s.shape == [] for s in stats.values())
    if loss.data != "rejected":
        assert {"rewards/chosen", "rewards/accuracies", "rewards/margins"} <= set(stats)


@pytest.mark.parametrize("name", list(PREFERENCE_LOSSES))
def test_every_loss_keeps_float32(name):
    loss = PREFERENCE_LOSSES[name]
    value, stats = loss(synthetic_inputs(loss, np.random.default_rng(2), dtype="float32"), {})
    assert value.dtype == paddle.float32 and np.isfinite(value.numpy())
    assert all(s.dtype == paddle.float32 and np.isfinite(s.numpy()) for s in stats.values()), stats


def test_dpo_loss_is_the_registry_entry():
    rng = np.random.default_rng(1)
    x = synthetic_inputs(PREFERENCE_LOSSES["sigmoid"], rng)
    direct, _ = PREFERENCE_LOSSES["sigmoid"](x, {"beta": 0.3})
    wrapped, _ = dpo_loss(x.policy[:, 0], x.policy[:, 1], x.reference[:, 0], x.reference[:, 1], beta=0.3)
    np.testing.assert_allclose(wrapped.numpy(), direct.numpy(), rtol=1e-12)


def args(**overrides):
    base = dict(PREFERENCE_HYPERPARAMETERS, loss_type="sigmoid", sft_loss_ratio=0.0, pref_loss_ratio=1.0, pipeline_parallel_degree=1)
    base.update(overrides)
    return types.SimpleNamespace(**base)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(loss_type="dpo"), "loss_type must be one of"),
        (dict(loss_type="rrhf", sft_loss_ratio=1.0), "rrhf already includes the NLL"),
        (dict(loss_type="npo", sft_loss_ratio=0.5), "npo trains on rejected answers only"),
        (dict(loss_type="lipo", pipeline_parallel_degree=2), "lipo trains on lists; pipeline parallel"),
        (dict(loss_type="rdpo", reference_free=True), "rdpo needs a reference model"),
        (dict(loss_type="pro", label_smoothing=0.1), "label_smoothing applies to sigmoid, simpo only, not 'pro'"),
    ],
)
def test_argument_problems_read_the_facts(overrides, message):
    problems = loss_argument_problems(args(**overrides))
    assert len(problems) == 1 and message in problems[0], problems


def test_argument_problems_list_every_problem_and_unused_magnitudes():
    assert loss_argument_problems(args()) == []
    assert len(loss_argument_problems(args(loss_type="cpo", sft_loss_ratio=1.0, label_smoothing=0.1))) == 2
    assert unused_hyperparameters(args(loss_type="ipo", simpo_gamma=1.0, beta=0.5)) == ["simpo_gamma"]
    assert unused_hyperparameters(args(loss_type="rrhf", beta=0.5)) == ["beta"]


def test_objective_lays_out_answer_major_rows():
    """Lists of K=3 for B=2 prompts: row k*B+b is answer k of prompt b; the NLL targets the best
    scored answer of each prompt: -(logp) / (length) summed over both prompts."""
    logps = paddle.to_tensor([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0])  # rows: a0b0 a0b1 a1b0 a1b1 a2b0 a2b1
    lengths = paddle.to_tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    scores = paddle.to_tensor([[0.0, 2.0, 1.0], [3.0, 1.0, 2.0]])  # best: answer 1 of b0, answer 0 of b1
    a = args(loss_type="pro", sft_loss_ratio=1.0)
    loss, stats = preference_objective(a, logps, lengths, None, scores=scores, valid=paddle.ones([2, 3]))
    np.testing.assert_allclose(stats["loss/sft"].numpy(), (3.0 + 2.0) / (3.0 + 2.0), rtol=1e-6)
    np.testing.assert_allclose(stats["logps/chosen"].numpy(), (-3.0 - 2.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(stats["logps/rejected"].numpy(), (-1.0 - 5.0 - 4.0 - 6.0) / 4, rtol=1e-6)
    np.testing.assert_allclose(loss.numpy(), stats["loss/dpo"].numpy() + 1.0, rtol=1e-6)
