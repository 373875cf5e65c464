"""Tensor-parallel split / merge (ppo/strategy/tensor/reshard.py): round trips for every kind and degree,
the same shards as PaddleNLP's own mappings on Llama and Qwen2 state dicts (fused layouts
included), state-dict resharding 2 -> 1 -> 2 and 2 -> 4, and bad input named."""
import copy

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ppo.strategy.tensor import reshard


@pytest.mark.parametrize("kind", reshard.KINDS)
@pytest.mark.parametrize("degree", [1, 2, 4])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_merge_of_split_is_the_weight(kind, degree, as_tensor):
    w = np.arange(8 * 16, dtype="float32").reshape(8, 16)
    x = paddle.to_tensor(w) if as_tensor else w
    shards = reshard.split(x, kind, degree)
    assert len(shards) == degree
    if kind != "replicated" and degree > 1:
        axis = 1 if kind.startswith("column") else 0
        assert all(s.shape[axis] == w.shape[axis] // degree for s in shards)
    merged = reshard.merge(shards, kind)
    np.testing.assert_array_equal(np.asarray(merged), w)
    bias = np.arange(16, dtype="float32")
    if kind != "row":
        np.testing.assert_array_equal(reshard.merge(reshard.split(bias, kind, degree), kind), bias)


def test_fused_gate_up_shards_hold_their_own_gate_and_up_columns():
    gate, up = np.full((3, 4), 1.0), np.full((3, 4), 2.0)
    gate[:, 2:] += 10  # rank 1's gate columns
    up[:, 2:] += 10
    s0, s1 = reshard.split(np.concatenate([gate, up], 1), "column_2fuse", 2)
    np.testing.assert_array_equal(s0, np.concatenate([gate[:, :2], up[:, :2]], 1))
    np.testing.assert_array_equal(s1, np.concatenate([gate[:, 2:], up[:, 2:]], 1))
    plain = np.concatenate([s0, s1], 1)  # what a plain column concat would (wrongly) rebuild
    assert not np.array_equal(plain, np.concatenate([gate, up], 1))


def tiny(kind, **extra):
    paddle.seed(1)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=32)
    config = (LlamaConfig if kind == "llama" else Qwen2Config)(**common)
    for k, v in extra.items():
        setattr(config, k, v)
    return (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(config)


@pytest.mark.parametrize("kind,extra", [
    ("llama", {}), ("llama", {"fuse_attention_ffn": True}), ("llama", {"fuse_attention_qkv": True}),
    ("llama", {"tie_word_embeddings": True}), ("qwen2", {}), ("qwen2", {"fuse_attention_ffn": True}),
])
@pytest.mark.parametrize("degree", [2, 4])
def test_split_matches_paddlenlp_mappings_and_round_trips(kind, extra, degree):
    model = tiny(kind, **extra)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    kinds = reshard.tensor_parallel_kinds(type(model), model.config, list(state), degree)
    if extra.get("fuse_attention_ffn"):
        assert kinds["llama.layers.0.mlp.gate_up_fused_proj.weight" if kind == "llama" else
                     "qwen2.layers.0.mlp.gate_up_fused_proj.weight"] == "column_2fuse"
    assert set(kinds.values()) >= {"column", "row", "replicated"}
    ours = reshard.split_state_dict(state, kinds, degree)
    config = copy.deepcopy(model.config)
    config.tensor_parallel_degree = degree
    for rank in range(degree):
        config.tensor_parallel_rank = rank
        theirs = type(model).convert_tensor_parallel(None, config, state_dict=dict(state))
        for name in state:
            np.testing.assert_array_equal(np.asarray(ours[rank][name]), np.asarray(theirs[name]), err_msg=f"{name} rank {rank}")
    merged = reshard.merge_state_dicts(ours, kinds)
    for name in state:
        np.testing.assert_array_equal(merged[name], state[name], err_msg=name)


def test_state_dicts_reshard_2_to_1_to_2_and_2_to_4():
    model = tiny("llama", fuse_attention_ffn=True)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    kinds = reshard.tensor_parallel_kinds(type(model), model.config, list(state), 2)
    two = reshard.split_state_dict(state, kinds, 2)
    one = reshard.reshard_state_dicts(two, kinds, 1)
    back = reshard.reshard_state_dicts(one, kinds, 2)
    for r in range(2):
        for name in state:
            np.testing.assert_array_equal(back[r][name], two[r][name], err_msg=name)
    four = reshard.reshard_state_dicts(two, kinds, 4)
    assert len(four) == 4
    for name in state:
        np.testing.assert_array_equal(reshard.merge_state_dicts(four, kinds)[name], state[name], err_msg=name)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="q_proj.weight: axis 1 of shape \\[4, 6\\] does not divide into 4"):
        reshard.split(np.zeros((4, 6)), "column", 4, name="q_proj.weight")
    with pytest.raises(ValueError, match="o_proj.weight: unknown tensor-parallel kind 'diagonal'"):
        reshard.split(np.zeros((4, 4)), "diagonal", 2, name="o_proj.weight")
    with pytest.raises(ValueError, match="shards of different shapes"):
        reshard.merge([np.zeros((2, 2)), np.zeros((2, 3))], "column")
    with pytest.raises(KeyError, match="no tensor-parallel kind for \\['extra.weight'\\]"):
        reshard.split_state_dict({"extra.weight": np.zeros(2)}, {}, 2)
