"""rollout_moe_experts (csrc/cpu/moe_experts.cc) vs its pure-Paddle twin (`moe_mlp.moe_experts`,
grouped_dispatch of SwiGLU experts), and the engine's MoE MLP (`moe_mlp.routed_mlp`) with either op
set vs the training forward's `SparseMoeBlock` on Qwen3-MoE, Qwen2-MoE (gated shared expert),
Mixtral and ERNIE 4.5 MoE (correction bias, shared experts, norm_min) routing, with
``norm_topk_prob`` on and off: outputs within 1e-5 (measured max 5.4e-7 op vs twin, 3.6e-7 vs the
training block), routing identical."""
import numpy as np
import paddle
import pytest

from ppo.rollout.moe_mlp import RoutingRecord, moe_weights, routed_mlp
from tests.rollout_ops_helpers import assert_close, custom_and_fallback_ops
from tests.test_qwen3_moe_rollout import random_moe


@pytest.fixture(scope="module")
def rollout_ops():
    return custom_and_fallback_ops()


def _case(rng, n, hidden, width, experts, top_k, skewed=False):
    x = paddle.to_tensor(rng.standard_normal((n, hidden)).astype("float32"))
    if skewed:  # every token on expert 0 (many row blocks), expert 1 second, the rest idle
        chosen = np.tile(np.arange(top_k), (n, 1))
    else:
        chosen = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(n)])
    weights = paddle.to_tensor(rng.uniform(0.05, 1.0, (n, top_k)).astype("float32"))
    def mat(rows, cols):  # 1/sqrt(fan-in) scale: activations of order 1, as in a trained model
        return paddle.to_tensor((rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype("float32"))

    gate_up, down = [mat(hidden, 2 * width) for _ in range(experts)], [mat(width, hidden) for _ in range(experts)]
    return x, weights, paddle.to_tensor(chosen.astype("int64")), gate_up, down


@pytest.mark.parametrize("n,hidden,width,experts,top_k,skewed", [
    (16, 256, 256, 8, 2, False),  # the bench's decode step
    (1, 64, 48, 4, 1, False),
    (7, 40, 20, 6, 3, False),  # 16-column blocks with tails, experts nobody chose
    (37, 24, 8, 5, 2, True),  # 37 rows on one expert: 9 full 4-row blocks and a partial one
    (300, 64, 96, 8, 4, False),  # a prefill's many rows
])
def test_the_op_equals_its_paddle_twin(rollout_ops, n, hidden, width, experts, top_k, skewed):
    custom, fb = rollout_ops
    args = _case(np.random.default_rng(n), n, hidden, width, experts, top_k, skewed)
    out = custom.moe_experts(*args)
    assert out.shape == [n, hidden]
    assert_close(out, fb.moe_experts(*args), atol=1e-5, rtol=1e-5)


def test_the_op_refuses_an_expert_index_out_of_range(rollout_ops):
    custom, _ = rollout_ops
    x, weights, indices, gate_up, down = _case(np.random.default_rng(0), 3, 16, 8, 4, 2)
    indices[1, 0] = 4
    with pytest.raises(Exception, match="expert index 4 out of"):
        custom.moe_experts(x, weights, indices, gate_up, down)
    with pytest.raises(Exception, match="one tensor per expert"):
        custom.moe_experts(x, weights, indices, gate_up, down[:3])


FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "ernie4_5_moe"]


@pytest.fixture(scope="module")
def models():
    return {family: random_moe(family) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("flip_norm", [False, True])
def test_the_engine_block_equals_the_training_block(rollout_ops, models, family, flip_norm):
    """Every MoE layer: the training block's output and experts on 2 x 5 tokens vs `routed_mlp`
    with each op set, as a prefill [B, T, H], a decode step [N, H] and its cols layout [H, N];
    `flip_norm` turns ``norm_topk_prob`` the other way (both settings on every family)."""
    layers = models[family].get_decoder().moe_layers()
    assert layers and (family != "qwen2_moe" or layers[0].mlp.shared_layers()[1] is not None)
    rng = np.random.default_rng(7)
    for li, layer in enumerate(layers):
        block = layer.mlp
        norm = block.norm_topk_prob
        block.norm_topk_prob = norm != flip_norm
        try:
            x = paddle.to_tensor(rng.standard_normal((2, 5, block.gate.weight.shape[0])).astype("float32"))
            with paddle.no_grad():
                want, _, want_indices = block(x)
            weights = moe_weights(block, lambda t: t, lambda lin: lin.weight)
            for ops in rollout_ops:
                record = RoutingRecord(2, 5)
                got = routed_mlp(ops, x, weights, False, record, li, 0)
                assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"{ops.name} prefill")
                np.testing.assert_array_equal(record.result(5)[0].numpy().reshape([-1, block.top_k]),
                                              want_indices.numpy())
                flat = x.reshape([10, -1])
                assert_close(routed_mlp(ops, flat, weights, False), want.reshape([10, -1]), atol=1e-5, rtol=1e-5,
                             msg=f"{ops.name} decode")
                cols = routed_mlp(ops, flat.transpose([1, 0]).contiguous(), weights, True)
                assert_close(cols.transpose([1, 0]), want.reshape([10, -1]), atol=1e-5, rtol=1e-5,
                             msg=f"{ops.name} cols")
        finally:
            block.norm_topk_prob = norm


def test_the_op_takes_strided_expert_weights(rollout_ops):
    """Expert matrices that are views (column slices of a wider matrix) give the same result."""
    custom, fb = rollout_ops
    x, weights, indices, gate_up, down = _case(np.random.default_rng(3), 9, 32, 16, 4, 2)
    wide = [paddle.concat([g, paddle.ones([32, 8])], axis=1)[:, :32] for g in gate_up]
    assert not wide[0].is_contiguous()
    assert_close(custom.moe_experts(x, weights, indices, wide, down), fb.moe_experts(x, weights, indices, gate_up, down),
                 atol=1e-5, rtol=1e-5)
