"""Tensor parallelism of our own families (`ppo.models.families.tensor_parallel`), in one process:
the split mappings PaddleNLP's `from_pretrained` / `save_pretrained(merge_tensor_parallel=True)`
apply cut exactly the projections, embedding and LM head (never norms, routers, selection
biases), along the right axis, and merging the two ranks' slices gives the checkpoint back; the
widths a degree does not divide are refused by name. The runs themselves (TP 2 against one
process) are in tests/test_family_tensor_parallel_launch.py."""
import copy
import os
import re
import signal

import numpy as np
import paddle
import pytest

from ppo.strategy.tensor.reshard import merge_state_dicts, split_state_dict, tensor_parallel_kinds
from ppo.tiny.factory import _FAMILY_MODELS

SPLIT = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head")
ROWS = ("o_proj.weight", "down_proj.weight", "embed_tokens.weight")


def family_model(arch, **overrides):
    """A small random `arch` model (16 heads so that ERNIE's 8:1 grouping leaves 2 KV heads)."""
    paddle.seed(0)
    model = _FAMILY_MODELS[arch](64, 64, 2, 16, 48, 32)
    if not overrides:
        return model
    config = copy.deepcopy(model.config)
    for key, value in overrides.items():
        setattr(config, key, value)
    paddle.seed(0)
    return type(model)(config)


def rank_states(model, degree=2):
    """Each rank's state dict, cut by the class's own mappings as `from_pretrained` cuts it."""
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    out = []
    for rank in range(degree):
        config = copy.deepcopy(model.config)
        config.tensor_parallel_degree, config.tensor_parallel_rank = degree, rank
        tensors = {k: paddle.to_tensor(v) for k, v in state.items()}
        out.append({k: np.asarray(v) for k, v in type(model).convert_tensor_parallel(None, config, state_dict=tensors).items()})
    return state, out


def expected_axis(key, tied):
    if "lm_head" in key:
        return 0 if tied else 1
    return 0 if key.endswith(ROWS) else -1


ARCH_CASES = [*_FAMILY_MODELS, "ernie45_use_bias"]


@pytest.mark.parametrize("arch", ARCH_CASES)
def test_split_then_merge_gives_the_checkpoint_back(arch):
    model = family_model("ernie45", use_bias=True) if arch == "ernie45_use_bias" else family_model(arch)
    config = model.config
    state, ranks = rank_states(model)
    split_keys = {k for k in state if any(f".{name}." in f".{k}" for name in SPLIT)
                  and not k.endswith(("o_proj.bias", "down_proj.bias"))}  # a row-parallel bias is added whole
    assert {k for k in state if ranks[0][k].shape != state[k].shape} == split_keys
    for key in split_keys:
        axis = expected_axis(key, config.tie_word_embeddings)
        halves = np.split(state[key], 2, axis=axis)
        for rank in range(2):
            np.testing.assert_array_equal(ranks[rank][key], halves[rank], err_msg=key)
    for key in set(state) - split_keys:  # norms, routers, selection biases, row biases: whole on each rank
        for rank in range(2):
            np.testing.assert_array_equal(ranks[rank][key], state[key], err_msg=key)
    probe = copy.deepcopy(config)
    probe.tensor_parallel_degree, probe.tensor_parallel_rank = 2, 0
    merge = type(model)._get_tensor_parallel_mappings(probe, is_split=False)
    resolved = type(model)._resolve_prefix_keys(merge.keys(), state.keys())
    assert set(resolved.values()) == split_keys
    for short, key in resolved.items():
        np.testing.assert_array_equal(merge[short]([r[key] for r in ranks]), state[key], err_msg=key)
    # the repository's own reshard reads the same kinds from the class and round-trips whole state dicts
    kinds = tensor_parallel_kinds(type(model), config, list(state))
    assert {k for k, kind in kinds.items() if kind != "replicated"} == split_keys
    back = merge_state_dicts(split_state_dict(state, kinds, 2), kinds)
    assert all(np.array_equal(back[k], state[k]) for k in state)


def test_score_model_splits_its_backbone_and_keeps_the_head_whole():
    from ppo.models.score_model import score_model_class

    model = family_model("qwen3_moe")
    config = copy.deepcopy(model.config)
    scorer_class = score_model_class("qwen3_moe")
    paddle.seed(0)
    scorer = scorer_class(config)
    _, ranks = rank_states(scorer)
    assert ranks[0]["score_head.weight"].shape == (64, 1)
    assert ranks[0]["qwen3_moe.layers.1.mlp.experts.3.down_proj.weight"].shape == (12, 64)  # 24 / 2 rows
    assert ranks[0]["qwen3_moe.embed_tokens.weight"].shape == (32, 64)


@pytest.mark.parametrize("arch, overrides, message", [
    ("qwen3", dict(tensor_parallel_degree=16), "num_key_value_heads 8 is not divisible by tensor_parallel_degree 16"),
    ("ernie45", dict(tensor_parallel_degree=4), "ERNIE 4.5: tensor parallelism: num_key_value_heads 2 is not divisible"),
    ("qwen3_moe", dict(tensor_parallel_degree=2, moe_intermediate_size=25),
     "moe_intermediate_size 25 is not divisible by tensor_parallel_degree 2"),
    ("qwen2_moe", dict(tensor_parallel_degree=2, shared_expert_intermediate_size=9),
     "shared_expert width 9 is not divisible"),
])
def test_widths_the_degree_does_not_divide_are_refused_by_name(arch, overrides, message):
    """Refused in the model's constructor, before any layer (or fleet group) is built."""
    with pytest.raises(ValueError, match=message):
        family_model(arch, **overrides)


def test_the_argument_checks_name_an_indivisible_width_before_a_model_loads(tmp_path):
    from ppo.strategy.tensor.checks import model_problems

    family_model("ernie45").save_pretrained(str(tmp_path))  # 16 heads, 2 KV heads

    class Args:
        tensor_parallel_degree = 4

    assert model_problems(Args(), [("model_name_or_path", str(tmp_path)), ("reference", None)]) == [
        f"model_name_or_path {tmp_path}: num_key_value_heads 2 is not divisible by tensor_parallel_degree 4"]
    Args.tensor_parallel_degree = 2
    assert model_problems(Args(), [("model_name_or_path", str(tmp_path))]) == []


def test_mixtral_in_paddlenlp_block_sparse_moe_names_is_refused_under_tensor_parallelism():
    """PaddleNLP splits a checkpoint by our names before the class renames the hub's: refused by name."""
    from types import SimpleNamespace

    from ppo.models.families.mixtral_modeling import MixtralPretrainedModel

    model = SimpleNamespace(config=SimpleNamespace(tensor_parallel_degree=2))
    keys = ["mixtral.layers.0.block_sparse_moe.experts.0.w1.weight"]
    with pytest.raises(ValueError, match="block_sparse_moe layout is not split for tensor_parallel_degree > 1"):
        MixtralPretrainedModel._load_pretrained_model(model, {keys[0]: None}, keys)


def test_a_launch_with_an_indivisible_width_stops_with_one_line_before_a_model_loads(tiny_data_dir, tmp_path):
    """The tiny ERNIE 4.5 with 4 heads has one KV head: SFT at tensor_parallel_degree 2 from a cold
    two-process launch exits 2 naming the key, no traceback (the argument checks, not the model)."""
    from ppo.tiny.factory import build_tiny
    from tests.tp_launch import cold_launch, worker_logs

    model_dir, out = str(tmp_path / "ernie"), str(tmp_path / "out")
    build_tiny(model_dir, seed=5, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, arch="ernie45")
    argv = ["config/tiny/sft_argument.json", "--model_name_or_path", model_dir,
            "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl",
            "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--tensor_parallel_degree", "2",
            "--output_dir", out, "--logging_dir", f"{out}/vdl"]
    proc = cold_launch("sft/run_sft.py", argv, out, nproc=2, cpu_tp_standins=True)
    logs = worker_logs(f"{out}/launch", tail=10**6)
    # Both ranks refuse; the launcher reports rank 0's code, which is 2, or SIGTERM's when rank 1
    # exited first and the launcher stopped rank 0 (Paddle's launcher, not ours).
    assert proc.returncode in (2, 256 - signal.SIGTERM), (proc.returncode, logs)
    assert (f"run_sft.py: error: model_name_or_path {model_dir}: num_key_value_heads 1 is not divisible by "
            "tensor_parallel_degree 2") in logs
    assert not re.search(r"^Traceback \(most recent call last\)", logs, re.M), logs
    assert not os.path.exists(os.path.join(out, "model_state.pdparams"))
