"""FusedAdamW (ppo/optimization/optim.py over csrc/cpu/train_adamw.cc): the one-op step gives Paddle's AdamW
with global-norm clipping to float tolerance over several steps (decay on some parameters, a
learning-rate schedule, clipping active and not), keeps Paddle's optimizer state (so checkpoints
load either way), and falls back to Paddle's step where it does not apply."""
import numpy as np
import paddle
import pytest

from ppo.optimization.optim import FusedAdamW
from ppo import kernels

kernels.ensure_built()


def model_and_data(seed=0):
    paddle.seed(seed)
    model = paddle.nn.Sequential(paddle.nn.Linear(12, 16), paddle.nn.LayerNorm(16), paddle.nn.Linear(16, 3))
    x = paddle.to_tensor(np.random.default_rng(seed).standard_normal((5, 12)).astype("float32"))
    return model, x


def run(fused, max_grad_norm, loss_scale, steps=4, dtype_hook=None):
    model, x = model_and_data()
    decay_names = {p.name for n, p in model.named_parameters() if "bias" not in n and not n.startswith("1.")}
    schedule = paddle.optimizer.lr.LambdaDecay(1e-2, lambda s: 1.0 / (1 + s))
    opt = FusedAdamW(learning_rate=schedule, parameters=model.parameters(), weight_decay=0.1, beta1=0.8, beta2=0.95,
                     epsilon=1e-6, apply_decay_param_fun=lambda n: n in decay_names,
                     grad_clip=paddle.nn.ClipGradByGlobalNorm(max_grad_norm) if max_grad_norm else None, fused=fused)
    for _ in range(steps):
        loss = (model(x) ** 2).sum() * loss_scale
        loss.backward()
        opt.step()
        opt.clear_grad()
        schedule.step()
    return {n: p.numpy() for n, p in model.named_parameters()}, opt


@pytest.mark.parametrize("max_grad_norm,loss_scale", [(1.0, 100.0), (1.0, 1e-3), (0.0, 1.0)])
def test_fused_step_matches_paddle_adamw(max_grad_norm, loss_scale):
    fused, opt = run(True, max_grad_norm, loss_scale)
    plain, ref_opt = run(False, max_grad_norm, loss_scale)
    assert opt.fused_steps == 4 and ref_opt.fused_steps == 0
    for name in plain:
        np.testing.assert_allclose(fused[name], plain[name], rtol=2e-5, atol=2e-6, err_msg=name)
    for key in ("moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc"):  # the optimizer state, parameter by parameter
        mine = [opt._accumulators[key][p.name].numpy() for p in opt._parameter_list]
        ref = [ref_opt._accumulators[key][p.name].numpy() for p in ref_opt._parameter_list]
        assert len(mine) == len(ref) == 6
        for a, b in zip(mine, ref):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6 * max(1.0, float(np.abs(b).max())), err_msg=key)
    assert len(opt.state_dict()) == len(ref_opt.state_dict())


def test_falls_back_to_paddle_where_it_does_not_apply():
    model, x = model_and_data()
    opt = FusedAdamW(learning_rate=1e-2, parameters=model.parameters(), lazy_mode=True)
    (model(x) ** 2).sum().backward()
    opt.step()
    assert opt.fused_steps == 0 and "lazy" in opt._fused_reason(model.parameters())
    opt = FusedAdamW(learning_rate=1e-2, parameters=model.parameters(), grad_clip=paddle.nn.ClipGradByNorm(1.0))
    assert "ClipGradByNorm" in opt._fused_reason(model.parameters())


def test_the_op_refuses_mismatched_lists_by_name():
    model, _ = model_and_data()
    params = [p for p in model.parameters()]
    with pytest.raises(Exception, match="one entry per parameter"):
        paddle._C_ops._run_custom_op("train_adamw", params, params[:1], params, params, params, params,
                                     1e-3, 0.9, 0.999, 1e-8, 0.0, 1.0, [1] * len(params))
