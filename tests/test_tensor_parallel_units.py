"""Single-process pieces of tensor parallelism: load overrides, which axis a layer's weight
is split along, and the pass-through without a model-parallel group (the two-process
equivalence runs are in test_tensor_parallel.py)."""
from types import SimpleNamespace

import paddle
import pytest

from ppo.models.loading import load_overrides
from ppo.models.parallel_layers import model_parallel_group, vocab_parallel_head
from ppo.rollout.weights import TensorParallelGather, split_kind

MODEL_ARGS = SimpleNamespace(use_flash_attention=False, recompute_granularity="full", recompute_use_reentrant=False,
                             use_train_patch=True)


def training_args(**kw):
    base = dict(recompute=False, tensor_parallel_degree=1, tensor_parallel_rank=0, sequence_parallel=False)
    return SimpleNamespace(**{**base, **kw})


def test_overrides_carry_this_ranks_shard():
    out = load_overrides(MODEL_ARGS, training_args(tensor_parallel_degree=4, tensor_parallel_rank=3))
    assert out["tensor_parallel_degree"] == 4 and out["tensor_parallel_rank"] == 3
    assert out["tensor_parallel_output"] is False
    assert "tensor_parallel_degree" not in load_overrides(MODEL_ARGS, training_args())


def test_sequence_parallel_is_refused_not_ignored():
    with pytest.raises(ValueError, match="sequence_parallel"):
        load_overrides(MODEL_ARGS, training_args(tensor_parallel_degree=2, sequence_parallel=True))


@pytest.mark.parametrize("name, transpose_y, fused, kind", [
    ("ColumnParallelLinear", False, 1, "column"), ("ColumnParallelLoRALinear", False, 1, "column"),
    ("RowParallelLinear", False, 1, "row"), ("RowParallelLoRALinear", False, 1, "row"),
    ("VocabParallelEmbedding", False, 1, "row"), ("LlamaLMHead", False, 1, "column"), ("LlamaLMHead", True, 1, "row"),
    ("ColumnParallelLinear", False, 2, "column_2fuse"),
])
def test_split_kind_follows_paddlenlp_layouts(name, transpose_y, fused, kind):
    """Column parallel: [in, out / R] (output axis); row parallel: [in / R, out]; vocabulary
    parallel embedding: [V / R, H]; an LM head [H, V / R], or [V / R, H] when tied; a fused
    gate-up [H, 2I / R] holding this rank's gate and up columns."""
    layer = type(name, (), {})()
    assert split_kind(layer, transpose_y, fused) == kind


def test_without_fleet_weights_pass_through(tiny_model_dir):
    from ppo.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir)
    assert model_parallel_group() is None and vocab_parallel_head(model) is None
    gather = TensorParallelGather(model.config)
    q = model.llama.layers[0].self_attn.q_proj
    assert gather.group is None and gather.weight(q) is q.weight
    derived = q.weight * 2.0
    assert gather.weight(q, derived) is derived


def test_split_config_without_group_is_an_error():
    with pytest.raises(RuntimeError, match="model-parallel group"):
        TensorParallelGather(SimpleNamespace(tensor_parallel_degree=2))


@pytest.mark.parametrize("fused_parts, kind", [(1, "column"), (2, "column_2fuse")])
def test_gathered_slices_are_merged_back_to_the_full_weight(monkeypatch, fused_parts, kind):
    """The engine's gather (eval_mode single) puts a fused gate-up's [gate_r, up_r] slices back as
    [gate, up], not as a plain concatenation; a plain column weight by concatenation."""
    import numpy as np
    import paddle

    from ppo.models import parallel_layers
    from ppo.strategy.tensor import reshard

    full = paddle.to_tensor(np.arange(4 * 8, dtype="float32").reshape(4, 8))
    shards = reshard.split(full, kind, 2)
    monkeypatch.setattr(parallel_layers.dist, "all_gather", lambda out, value, group=None: out.extend(shards))
    gather = TensorParallelGather(SimpleNamespace(tensor_parallel_degree=1))
    gather.group = object()  # a model-parallel group (the collective is faked above)
    layer = type("ColumnParallelLinear", (), {})()
    layer.weight = shards[0]
    layer.weight.is_distributed = True
    np.testing.assert_array_equal(gather.weight(layer, fused_parts=fused_parts).numpy(), full.numpy())


def test_a_whole_model_is_cut_into_each_replica_ranks_slices(tiny_model_dir):
    """A split run's rollout replica of 2 ranks (`TensorParallelSlices`): rank r's q/k/v and
    gate/up columns, o_proj and down_proj rows, embedding rows and untied head columns (a
    vocabulary of 100) are its block of the whole weights (their concatenation over the ranks
    gives the whole back) and the heads halve, as PaddleNLP's mappings cut them."""
    import numpy as np

    from ppo.models.loading import load_causal_lm
    from ppo.rollout.weights import extract_weights

    lm = load_causal_lm(tiny_model_dir)
    whole = extract_weights(lm, fuse_gate_up=True)
    ranks = [extract_weights(lm, fuse_gate_up=True, sharded=True, group=SimpleNamespace(nranks=2, rank=r)) for r in (0, 1)]
    for r, part in enumerate(ranks):
        shard = part.shard
        assert (shard.degree, shard.vocab_start, shard.embed_sharded, shard.head_sharded) == (2, 50 * r, True, True)
        assert (part.num_heads, part.num_kv_heads, part.vocab_size) == (whole.num_heads // 2, whole.num_kv_heads // 2, 100)
    np.testing.assert_array_equal(np.concatenate([p.embed.numpy() for p in ranks]), whole.embed.numpy())
    np.testing.assert_array_equal(np.concatenate([p.lm_head.numpy() for p in ranks], axis=1), whole.lm_head.numpy())
    for i, layer in enumerate(whole.layers):
        o = np.concatenate([p.layers[i].o.numpy() for p in ranks], axis=0)
        down = np.concatenate([p.layers[i].down.numpy() for p in ranks], axis=0)
        np.testing.assert_array_equal(o, layer.o.numpy())
        np.testing.assert_array_equal(down, layer.down.numpy())
        h = whole.head_dim
        q = np.concatenate([p.layers[i].qkv.numpy()[:, :h * whole.num_heads // 2] for p in ranks], axis=1)
        np.testing.assert_array_equal(q, layer.qkv.numpy()[:, :h * whole.num_heads])
        inter = layer.gate_up.shape[1] // 2  # [gate | up] on each rank: its half of each
        gate = np.concatenate([p.layers[i].gate_up.numpy()[:, :inter // 2] for p in ranks], axis=1)
        np.testing.assert_array_equal(gate, layer.gate_up.numpy()[:, :inter])
