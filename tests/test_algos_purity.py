"""Static checks of the ppo.algos rules: imports only paddle/numpy/math (plus the
standard library modules listed), no ``.item()`` / ``.numpy()`` outside the normaliser,
and every public function documented."""
import ast
import inspect
import os

import pytest

import ppo.algos as algos
from tests.preference_shims import dpo_loss

ALGOS_DIR = os.path.dirname(algos.__file__)
FILES = sorted(f for f in os.listdir(ALGOS_DIR) if f.endswith(".py"))
ALLOWED_IMPORTS = {"paddle", "numpy", "math"}


@pytest.mark.parametrize("fname", FILES)
def test_imports_and_no_item(fname):
    src = open(os.path.join(ALGOS_DIR, fname)).read()
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                assert a.name.split(".")[0] in ALLOWED_IMPORTS, (fname, a.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            assert node.module.split(".")[0] in ALLOWED_IMPORTS, (fname, node.module)
        elif isinstance(node, ast.Attribute) and node.attr in ("item", "numpy", "tolist"):
            assert fname == "normalizer.py", f"{fname}: .{node.attr}() is not allowed in algos"


def test_every_public_callable_has_docstring():
    for name in algos.__all__:
        obj = getattr(algos, name)
        if callable(obj):
            assert inspect.getdoc(obj), name


@pytest.mark.parametrize("fname", FILES)
def test_no_inplace_tensor_methods(fname):
    """Paddle in-place methods end with '_' (add_, clip_, scale_, ...): none are used."""
    tree = ast.parse(open(os.path.join(ALGOS_DIR, fname)).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.endswith("_") and not node.attr.startswith("_"):
            raise AssertionError(f"{fname}: in-place call .{node.attr}")


def test_float32_smoke_every_function():
    """Every tensor function runs on float32 inputs, keeps float32 and gives finite values."""
    import numpy as np
    import paddle

    rng = np.random.default_rng(0)
    f = lambda *s: paddle.to_tensor(rng.normal(size=s).astype("float32"))  # noqa: E731
    B, T, V = 4, 5, 7
    mask = paddle.to_tensor((rng.random((B, T)) > 0.3).astype("int64"))
    lp, old, ref, adv, v, r = f(B, T) - 1, f(B, T) - 1, f(B, T) - 1, f(B, T), f(B, T), f(B, T)
    s = f(B)
    outs = [
        algos.masked_whiten(v, mask),
        *algos.kl_shaped_rewards(s, lp, ref, mask, 0.1, 5.0, kind="k3"),
        *algos.gae_advantages_and_returns(v, r, mask),
        algos.grpo_advantages(s, 2),
        algos.rloo_advantages(s, 2),
        *algos.reinforce_pp_advantages_and_returns(r, mask),
        algos.reinforce_pp_baseline_advantages(s, mask, 2),
        algos.ppo_policy_loss(lp, old, adv, mask, importance_sampling_level="sequence")[0],
        algos.aggregate_loss(v, mask, "seq-mean-token-sum-norm", loss_scale_factor=T),
        algos.kl_loss(lp, ref, mask, clamp=10.0)[0],
        algos.entropy_bonus_loss(f(B, T, V), mask)[0],
        algos.overlong_penalty(paddle.to_tensor([1, 3, 5, 5]), 5, 2, 1.0),
        algos.truncated_completion_mask(mask.astype("float32"), paddle.to_tensor([True, False, True, False])),
        algos.log1mexp(-paddle.abs(s) - 1e-6),
        algos.ppo_policy_loss(lp, old, adv, mask, dual_clip=3.0, num_tokens=30)[0],
        algos.value_loss(v, r, adv, mask, 0.2)[0],
        algos.kl_loss(lp, ref, mask)[0],
        algos.entropy_from_logits(f(B, T, V)),
        algos.sequence_logprobs(f(B, T, V), paddle.to_tensor(rng.integers(0, V, (B, T))), mask),
        algos.sft_loss(f(B, T, V), paddle.to_tensor(rng.integers(0, V, (B, T))))[0],
        algos.pairwise_reward_loss(s, f(B))[0],
        algos.pairwise_cost_loss(s, f(B), paddle.to_tensor([1, 1, -1, 1]), paddle.to_tensor([-1, 1, -1, -1]), 0.1)[0],
        algos.tokenwise_pairwise_cost_loss(
            lp, ref, paddle.to_tensor(rng.integers(0, V, (B, T))), paddle.to_tensor(rng.integers(0, V, (B, T))), mask, mask,
            paddle.to_tensor([1, 1, -1, 1]), paddle.to_tensor([-1, 1, -1, -1]), 0.1,
        )[0],
        dpo_loss(s - 5, f(B) - 5, f(B) - 5, f(B) - 5)[0],
        dpo_loss(s - 5, f(B) - 5, loss_type="orpo", chosen_lengths=[5] * B, rejected_lengths=[5] * B)[0],
        algos.kto_loss(s, f(B), paddle.to_tensor([1, 0, 1, 0]), 0.1)[0],
        algos.RunningMeanStd().update(s).normalize(s),
        algos.combined_advantages(adv, v, 1.5),
    ]
    for o in outs:
        assert o.dtype == paddle.float32
        assert np.all(np.isfinite(o.numpy()))
