"""Single-process pieces of tensor parallelism: load overrides, which axis a layer's weight
is split along, and the pass-through without a model-parallel group (the two-process
equivalence runs are in test_tensor_parallel.py)."""
from types import SimpleNamespace

import paddle
import pytest

from ppo.models.loading import load_overrides
from ppo.models.tensor_parallel import model_parallel_group, vocab_parallel_head
from ppo.rollout.weights import TensorParallelGather, split_axis

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


@pytest.mark.parametrize("name, transpose_y, axis", [
    ("ColumnParallelLinear", False, 1), ("ColumnParallelLoRALinear", False, 1), ("RowParallelLinear", False, 0),
    ("RowParallelLoRALinear", False, 0), ("VocabParallelEmbedding", False, 0), ("LlamaLMHead", False, 1),
    ("LlamaLMHead", True, 0),
])
def test_split_axis_follows_paddlenlp_layouts(name, transpose_y, axis):
    """Column parallel: [in, out / R] (output axis); row parallel: [in / R, out]; vocabulary
    parallel embedding: [V / R, H]; an LM head [H, V / R], or [V / R, H] when tied."""
    layer = type(name, (), {})()
    assert split_axis(layer, transpose_y) == axis


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
