"""The ERNIE 4.5 MoE family (`ppo.models.families.ernie45_moe`): the sparse block chooses experts
with the correction bias but weighs them with the unbiased probabilities (over max(sum,
moe_norm_min)) and adds the shared experts, sparse layers sit where ``moe_layer_start_index`` /
``moe_layer_end_index`` / ``moe_layer_interval`` put them, Hugging Face export -> import is exact
(tied and untied, both rope layouts), what is not computed is refused by name before weights
load, and, where a Python with torch and transformers is found, transformers'
`Ernie4_5_MoeForCausalLM` computes the same logits as ours, both ways."""
import json

import numpy as np
import paddle
import pytest

from ppo.models import hf_files, hf_format
from ppo.models.hf_convert import export_model
from ppo.models.hf_import import load_hf_model
from tests.hf_weights_helpers import IDS, MASK, PAD, SIZES, causal_logits, hf_python, randomize, transformers_round_trip

TRANSFORMERS_ATOL = 1e-4  # float32, torch vs Paddle kernels
MOE = dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=24, moe_num_shared_experts=2)


def ernie_moe_config(tied=True, **overrides):
    from ppo.models.families.ernie45_moe_modeling import Ernie4_5_MoeConfig

    fields = dict(SIZES, num_hidden_layers=3, head_dim=16, tie_word_embeddings=tied, rope_theta=5000.0,
                  pad_token_id=PAD, bos_token_id=1, eos_token_id=2, dtype="float32", **MOE)
    return Ernie4_5_MoeConfig(**{**fields, **overrides})


def ernie_moe_model(tied=True, seed=0, **overrides):
    """Random weights, the correction bias included (so selection and weighting differ)."""
    from ppo.models.families.ernie45_moe_modeling import Ernie4_5_MoeForCausalLM

    return randomize(Ernie4_5_MoeForCausalLM(ernie_moe_config(tied, **overrides)), seed)


def reference_block(block, x):
    """transformers' `Ernie4_5_MoeSparseMoeBlock` in numpy on ``x [N, H]``: top-k of probs + bias,
    weights = unbiased probs / max(sum, norm_min), every expert dense, plus the shared experts."""
    probs = paddle.nn.functional.softmax(block.gate(x), axis=-1).numpy()
    bias = block.moe_statics.e_score_correction_bias.numpy()[0]
    every = np.stack([expert(x).numpy() for expert in block.experts], axis=1)  # [N, E, H]
    out = block.shared_experts(x).numpy()
    for n in range(x.shape[0]):
        top = np.argsort(-(probs[n] + bias))[:block.top_k]
        w = probs[n, top] / max(probs[n, top].sum(), block.norm_min)
        out[n] += (w[:, None] * every[n, top]).sum(0)
    return out


def test_the_block_selects_with_the_bias_weighs_without_it_and_adds_the_shared_experts():
    model = ernie_moe_model()
    block = model.ernie.layers[1].mlp
    with paddle.no_grad():  # a bias large enough to overturn the router's own top-2
        block.moe_statics.e_score_correction_bias.set_value(paddle.to_tensor([[0.0, 0.0, 5.0, 5.0]]))
    x = paddle.randn([2, 5, 32])
    out, logits, indices = block(x)
    assert sorted(set(indices.numpy().reshape(-1).tolist())) == [2, 3]
    np.testing.assert_allclose(out.reshape([10, 32]).numpy(), reference_block(block, x.reshape([10, 32])),
                               rtol=1e-5, atol=1e-6)
    assert list(block.shared_experts.down_proj.weight.shape) == [48, 32]  # 24 x 2 shared experts


def test_sparse_layers_follow_start_end_and_interval():
    from ppo.models.families.ernie45_moe_modeling import ErnieMoeBlock

    model = ernie_moe_model(num_hidden_layers=6, moe_layer_start_index=1, moe_layer_end_index=4, moe_layer_interval=2)
    assert [isinstance(layer.mlp, ErnieMoeBlock) for layer in model.ernie.layers] == [False, True, False, True,
                                                                                     False, False]
    assert ernie_moe_config().moe_layer_end_index == 2  # -1: the last layer


@pytest.mark.parametrize("tied", [True, False])
def test_export_then_import_gives_identical_logits(tmp_path, tied):
    model = ernie_moe_model(tied=tied, output_router_logits=True)
    config = export_model(model, str(tmp_path))
    assert config["architectures"] == ["Ernie4_5_MoeForCausalLM"] and config["moe_num_experts"] == 4
    shapes = {n: tuple(v.shape) for n, v in hf_files.read_safetensors(str(tmp_path)).items()}
    assert shapes == hf_format.expected_hf_shapes(config)
    assert shapes["model.layers.1.mlp.moe_statics.e_score_correction_bias"] == (1, 4)
    assert shapes["model.layers.2.mlp.shared_experts.up_proj.weight"] == (48, 32)
    assert "model.layers.1.mlp.gate_proj.weight" not in shapes and shapes["model.layers.0.mlp.gate_proj.weight"] == (48, 32)
    back = load_hf_model(str(tmp_path))
    assert np.abs(causal_logits(back) - causal_logits(model)).max() == 0.0
    assert (back.lm_head.weight is back.ernie.embed_tokens.weight) == tied and back.config.output_router_logits


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_both_config_layouts_read_the_same(tmp_path, layout):
    model = ernie_moe_model(tied=False)
    config = export_model(model, str(tmp_path))
    config.pop("rope_parameters" if layout == "transformers4" else "rope_theta")
    config.pop("rope_scaling")
    hf_files.write_json(config, str(tmp_path / "config.json"))
    back = load_hf_model(str(tmp_path))
    assert back.config.rope_theta == 5000.0 and back.config.num_experts == 4
    np.testing.assert_array_equal(causal_logits(back), causal_logits(model))


@pytest.mark.parametrize("change, named", [
    ({"moe_gate": "top2_fused_sigmoid"}, "moe_gate 'top2_fused_sigmoid'"),
    ({"moe_gate_act": "sigmoid"}, "moe_gate_act 'sigmoid'"),
    ({"use_bias": True}, "use_bias true"),
    ({"moe_num_experts": [4, 4]}, "moe_num_experts [4, 4]"),
])
def test_fields_not_computed_here_are_refused_by_name_before_weights_load(tmp_path, change, named):
    config = export_model(ernie_moe_model(), str(tmp_path))
    hf_files.write_json(dict(config, **change), str(tmp_path / "config.json"))
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    with pytest.raises(ValueError, match="Ernie4_5_MoeForCausalLM config: not supported here: " + named.replace("[", r"\[")):
        load_hf_model(str(tmp_path))


HF_SIZES = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, pad_token_id=PAD, moe_num_experts=4, moe_k=2,
                moe_intermediate_size=24, moe_num_shared_experts=1)


@pytest.mark.skipif(hf_python() is None, reason="no Python with torch and transformers (set PADDLE_ALIGN_HF_PYTHON)")
def test_transformers_computes_the_same_logits_both_ways(tmp_path):
    ours = {"tied": ernie_moe_model(tied=True), "untied": ernie_moe_model(tied=False, seed=3, moe_num_shared_experts=0)}
    built = {  # written by transformers 5, one in each config layout (head_dim absent: hidden / heads)
        "hf_tied_v5": dict(HF_SIZES, model_type="ernie4_5_moe", tie_word_embeddings=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 3000.0}),
        "hf_untied_v4": dict(HF_SIZES, model_type="ernie4_5_moe", tie_word_embeddings=False, moe_layer_interval=2,
                             moe_layer_start_index=0, rope_parameters={"rope_type": "default", "rope_theta": 7000.0}),
    }
    out, diffs = transformers_round_trip(ours, built, tmp_path)
    print("max |logit diff| vs transformers:", diffs)
    assert max(diffs.values()) <= TRANSFORMERS_ATOL, diffs
    assert [str(o["class_name"]) for o in out] == ["Ernie4_5_MoeForCausalLM"] * 4
    assert [bool(o["tied"]) for o in out] == [True, False, True, False]
    for i, name in enumerate(built, start=len(ours)):
        back = out[i]["ours"]
        assert ("rope_parameters" in json.load(open(tmp_path / name / "config.json"))) == name.endswith("v5")
        assert back.config.rope_theta == built[name]["rope_parameters"]["rope_theta"] and back.config.head_dim == 8
        assert (back.lm_head.weight is back.ernie.embed_tokens.weight) == bool(out[i]["tied"])
        assert float(np.abs(back.ernie.layers[1].mlp.moe_statics.e_score_correction_bias.numpy()).sum()) > 0


def test_router_losses_replay_and_the_score_model(tmp_path):
    """The shared MoE classes on ERNIE's block: aux loss over both MoE layers, replaying the
    recorded (bias-chosen) experts gives the same logits, other experts do not; the score model
    on this backbone round-trips through Hugging Face files."""
    from ppo.models.families.moe import load_balancing_loss
    from ppo.models.score_model import SCORE_CONFIG_DEFAULTS, score_model_class
    from tests.hf_weights_helpers import end_scores

    model = ernie_moe_model(output_router_logits=True, router_aux_loss_coef=0.1)
    kwargs = dict(input_ids=paddle.to_tensor(IDS), attention_mask=paddle.to_tensor(MASK), return_dict=True)
    out = model(**kwargs)
    aux = load_balancing_loss(out.router_logits, 4, 2, paddle.to_tensor(MASK))
    assert len(out.router_logits) == 2 and abs(float(out.aux_loss) - 0.1 * float(aux)) < 1e-7
    recorded = model.last_expert_indices()
    np.testing.assert_array_equal(model(**kwargs, moe_expert_indices=recorded).logits.numpy(), out.logits.numpy())
    moved = model(**kwargs, moe_expert_indices=[(i + 1) % 4 for i in recorded])
    assert np.abs(moved.logits.numpy() - out.logits.numpy()).max() > 1e-3
    config = ernie_moe_config()
    for key, value in SCORE_CONFIG_DEFAULTS.items():
        setattr(config, key, value)
    scorer = randomize(score_model_class("ernie4_5_moe")(config), 1)
    assert export_model(scorer, str(tmp_path))["architectures"] == ["Ernie4_5_MoeForSequenceClassification"]
    back = load_hf_model(str(tmp_path))
    assert type(back).__name__ == "Ernie4_5_MoeModelForScore"
    np.testing.assert_array_equal(end_scores(back), end_scores(scorer))


def test_moe_settings_on_a_dense_ernie45_are_refused_by_name(tmp_path):
    from tests.test_ernie45_family import ernie_model

    config = export_model(ernie_model(), str(tmp_path))
    hf_files.write_json(dict(config, moe_num_experts=8, moe_k=2), str(tmp_path / "config.json"))
    with pytest.raises(ValueError, match=r"Ernie4_5ForCausalLM config: not supported here: moe_num_experts, moe_k on a "
                                         r"dense model \(model_type ernie4_5; the MoE family is ernie4_5_moe\)"):
        load_hf_model(str(tmp_path))


def test_a_resume_names_another_shared_expert_count(tmp_path):
    from ppo.checkpoints.resume_check import fact_differences, model_facts, saved_model_facts

    ernie_moe_model().save_pretrained(str(tmp_path))
    found = fact_differences(saved_model_facts(str(tmp_path)), model_facts(ernie_moe_model(moe_num_shared_experts=1)),
                             "model")
    assert found == ["model: moe_num_shared_experts is 2 in the checkpoint but 1 in this run"]


def test_the_router_runs_in_float32_for_bfloat16_weights():
    """transformers keeps ERNIE's router in float32 (``hidden.float() @ weight.float()``): the block
    and the engine's copy of it say so, and the router product of bfloat16 tensors is float32
    (the CPU has no bfloat16 matmul to run the whole block)."""
    from ppo.models.families.moe import router_logits
    from ppo.rollout.moe_mlp import moe_weights

    block = ernie_moe_model().ernie.layers[1].mlp
    assert block.router_float32 and moe_weights(block, lambda t: t, lambda layer: layer.weight).router_float32
    x, w = paddle.randn([3, 32]).astype("bfloat16"), block.gate.weight.astype("bfloat16")
    logits = router_logits(x, w, block.router_float32)
    assert logits.dtype == paddle.float32
    np.testing.assert_allclose(logits.numpy(), x.astype("float32").numpy() @ w.astype("float32").numpy(), rtol=1e-5,
                               atol=1e-5)


def test_multi_token_prediction_tensors_are_skipped_as_transformers_skips_them(tmp_path):
    from ppo.models.hf_checks import hf_model_problems

    model = ernie_moe_model()
    export_model(model, str(tmp_path))
    tensors = hf_files.read_safetensors(str(tmp_path))
    tensors["model.mtp_linear_proj.0.weight"] = np.zeros([32, 64], "float32")
    hf_files.write_safetensors(tensors, str(tmp_path))
    assert hf_model_problems("model_name_or_path", str(tmp_path)) == []
    np.testing.assert_array_equal(causal_logits(load_hf_model(str(tmp_path))), causal_logits(model))
