"""The Qwen2-MoE family (`ppo.models.families.qwen2_moe`): the sparse block adds the shared expert
scaled by its sigmoid gate to the routed sum, attention has q/k/v biases and no q/k norm, Hugging
Face export -> import is exact (tied and untied, both rope layouts, shapes as transformers
declares them), and, where a Python with torch and transformers is found, transformers'
`Qwen2MoeForCausalLM` computes the same logits as ours, both ways."""
import numpy as np
import paddle
import pytest

from ppo.models import hf_files, hf_format
from ppo.models.hf_convert import export_model
from ppo.models.hf_import import load_hf_model
from tests.hf_weights_helpers import (PAD, SIZES, causal_logits, family_score_model, hf_python, randomize,
                                      transformers_round_trip)

TRANSFORMERS_ATOL = 1e-4  # float32, torch vs Paddle kernels

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40)


def qwen2_moe_model(tied=False, seed=0, **overrides):
    from ppo.models.families.qwen2_moe_modeling import Qwen2MoeConfig, Qwen2MoeForCausalLM

    fields = dict(SIZES, num_hidden_layers=3, tie_word_embeddings=tied, rms_norm_eps=1e-6, rope_theta=5000.0,
                  pad_token_id=PAD, bos_token_id=1, eos_token_id=2, dtype="float32", mlp_only_layers=[0], **MOE)
    return randomize(Qwen2MoeForCausalLM(Qwen2MoeConfig(**{**fields, **overrides})), seed)


def test_the_block_adds_the_gated_shared_expert_and_attention_has_qkv_biases():
    from tests.test_qwen3_moe_family import dense_reference

    model = qwen2_moe_model()
    block = model.qwen2_moe.layers[1].mlp
    x = paddle.randn([6, 32])
    out, _, _ = block(x.unsqueeze(0))
    gate = 1.0 / (1.0 + np.exp(-(x.numpy() @ block.shared_expert_gate.weight.numpy())))  # [N, 1]
    expected = dense_reference(block, x) + gate * block.shared_expert(x).numpy()
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-5, atol=1e-6)
    attn = model.qwen2_moe.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None and not hasattr(attn, "q_norm")
    assert model.config.head_dim == 8  # hidden / heads


@pytest.mark.parametrize("tied, layout", [(True, "transformers5"), (False, "transformers4")])
def test_export_then_import_gives_identical_logits(tmp_path, tied, layout):
    model = qwen2_moe_model(tied=tied)
    config = export_model(model, str(tmp_path))
    assert config["architectures"] == ["Qwen2MoeForCausalLM"] and config["qkv_bias"] is True
    shapes = {n: tuple(v.shape) for n, v in hf_files.read_safetensors(str(tmp_path)).items()}
    assert shapes == hf_format.expected_hf_shapes(config)
    assert shapes["model.layers.1.mlp.shared_expert_gate.weight"] == (1, 32)
    assert shapes["model.layers.2.mlp.shared_expert.down_proj.weight"] == (32, 40)
    assert shapes["model.layers.0.self_attn.k_proj.bias"] == (16,) and "model.layers.0.mlp.gate.weight" not in shapes
    config.pop("rope_parameters" if layout == "transformers4" else "rope_theta")
    hf_files.write_json(config, str(tmp_path / "config.json"))
    back = load_hf_model(str(tmp_path))
    assert back.config.rope_theta == 5000.0 and (back.lm_head.weight is back.qwen2_moe.embed_tokens.weight) == tied
    assert np.abs(causal_logits(back) - causal_logits(model)).max() == 0.0


HF_SIZES = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=PAD, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40)


@pytest.mark.skipif(hf_python() is None, reason="no Python with torch and transformers (set PADDLE_ALIGN_HF_PYTHON)")
def test_transformers_computes_the_same_logits_both_ways(tmp_path):
    ours = {"tied": qwen2_moe_model(tied=True, norm_topk_prob=True), "untied": qwen2_moe_model(seed=3)}
    built = {
        "hf_tied_v5": dict(HF_SIZES, model_type="qwen2_moe", tie_word_embeddings=True, norm_topk_prob=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 3000.0}),
        "hf_untied_v4": dict(HF_SIZES, model_type="qwen2_moe", tie_word_embeddings=False, decoder_sparse_step=2,
                             mlp_only_layers=[0], rope_parameters={"rope_type": "default", "rope_theta": 7000.0}),
    }
    scorer = family_score_model("qwen2_moe", qwen2_moe_model(seed=5).config)
    out, diffs = transformers_round_trip(ours, built, tmp_path, scorer=scorer)
    print("max |logit diff| vs transformers:", diffs)
    assert max(diffs.values()) <= TRANSFORMERS_ATOL, diffs
    assert [str(o["class_name"]) for o in out] == ["Qwen2MoeForCausalLM"] * 4 + ["Qwen2MoeForSequenceClassification"]
    assert [bool(o["tied"]) for o in out] == [True, False, True, False, False]
    assert out[3]["ours"].config.rope_theta == 7000.0 and out[2]["ours"].config.qkv_bias


@pytest.mark.parametrize("kind, family", [("qwen2", "qwen2_moe"), ("llama", "mixtral")])
def test_moe_settings_on_a_dense_paddlenlp_model_are_refused_by_name(tmp_path, kind, family):
    from tests.hf_weights_helpers import tiny_model

    config = export_model(tiny_model(kind), str(tmp_path))
    hf_files.write_json(dict(config, num_experts=8, num_experts_per_tok=2), str(tmp_path / "config.json"))
    with pytest.raises(ValueError, match=f"num_experts, num_experts_per_tok on a dense model \\(model_type {kind}; "
                                         f"the MoE family is {family}\\)"):
        load_hf_model(str(tmp_path))
