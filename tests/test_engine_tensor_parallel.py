"""The rollout engine under tensor parallel on two CPU processes: eval_mode `single` (whole
weights gathered) and `tensor_parallel` (each rank keeps its slices; all-reduce after
attention, MLP and embedding; logits gathered) give the TP=1 engine's greedy tokens and
log-probs and, with one seed, the same sampled tokens on both ranks; for a plain Llama with
grouped-query attention, for one with fused q/k/v and gate/up projections, and for our own
Qwen3 (per-head q/k norms) and ERNIE 4.5 (interleaved RoPE) split by their families' classes."""
import functools
import os

import numpy as np
import pytest

from tests.engine_tp_worker import engine_prompts, run_engine
from tests.tp_launch import launch_run


def build_model_dir(path, fused):
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, eos_token_id=2,
                         pad_token_id=0, bos_token_id=1, fuse_attention_qkv=fused, fuse_attention_ffn=fused,
                         tie_word_embeddings=False, dtype="float32")
    paddle.seed(13)
    model = LlamaForCausalLM(config)
    with paddle.no_grad():  # larger weights than the 0.02 init: distinct, confident greedy tokens
        for p in model.parameters():
            if len(p.shape) == 2:
                p.set_value(p * 25.0)
    model.save_pretrained(path)
    return model


def build_family_dir(path, arch):
    """Our Qwen3 or ERNIE 4.5 in the Llama models' shapes (4 heads, 2 KV heads of 16), weights scaled as theirs."""
    import paddle

    from ppo.models.families import family_module

    module = family_module(arch)
    config = module.CONFIG_CLASS(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                                 rms_norm_eps=1e-6, eos_token_id=2, pad_token_id=0, bos_token_id=1,
                                 tie_word_embeddings=False, dtype="float32")
    paddle.seed(13)
    model = module.CAUSAL_LM_CLASS(config)
    with paddle.no_grad():
        for p in model.parameters():
            if len(p.shape) == 2:
                p.set_value(p * 25.0)
    model.save_pretrained(path)
    return model


FUSED = {"split_projections": False, "fused_qkv_gate_up": True}
BUILDERS = {**{name: functools.partial(build_model_dir, fused=fused) for name, fused in FUSED.items()},
            "qwen3_qk_norm": functools.partial(build_family_dir, arch="qwen3"),
            "ernie45_interleaved_rope": functools.partial(build_family_dir, arch="ernie4_5")}


@pytest.fixture(scope="module")
def tp2_engine_outputs(tmp_path_factory):
    """`{variant: (model, TP=2 output dir)}`: both models through ONE two-process launch (the
    worker takes several model/output pairs and loads and runs each on its own)."""
    root = tmp_path_factory.mktemp("engine_tp2")
    models, args = {}, []
    for name, build in BUILDERS.items():
        model_dir, out = str(root / name / "model"), str(root / name / "out")
        models[name] = (build(model_dir), out)
        args += [model_dir, out]
    launch_run("tests/engine_tp_worker.py", args, str(root / "launch_out"))
    return models


@pytest.mark.parametrize("variant", list(BUILDERS))
def test_sharded_and_gathered_engines_match_tp1(variant, tp2_engine_outputs):
    model, out = tp2_engine_outputs[variant]
    model.eval()
    ids, mask = engine_prompts(model.config.vocab_size)
    reference = run_engine(model, "single", ids, mask)  # one process: nothing to gather or shard
    assert reference["single_qkv_out"] == (4 + 2 * 2) * 16
    ranks = [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in (0, 1)]
    for mode in ("single", "tensor_parallel"):
        for rank in ranks:
            for kind in ("greedy", "sampled"):
                np.testing.assert_array_equal(rank[f"{mode}_{kind}_tokens"], reference[f"single_{kind}_tokens"],
                                              err_msg=f"{mode} {kind}")
                np.testing.assert_array_equal(rank[f"{mode}_{kind}_lengths"], reference[f"single_{kind}_lengths"])
                np.testing.assert_allclose(rank[f"{mode}_{kind}_logprobs"], reference[f"single_{kind}_logprobs"],
                                           atol=1e-4, err_msg=f"{mode} {kind}")
    for rank in ranks:
        assert str(rank["tensor_parallel_greedy_weights"]) == "tensor_parallel_slices"
        assert str(rank["single_greedy_weights"]) == "whole"
        assert rank["single_qkv_out"] == reference["single_qkv_out"]  # gathered: the whole q/k/v
        assert rank["tensor_parallel_qkv_out"] == reference["single_qkv_out"] // 2  # this rank's heads only
    assert len(set(reference["single_greedy_tokens"].ravel().tolist())) > 3  # not one token repeated
