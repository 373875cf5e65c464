"""The Mixtral family (`ppo.models.families.mixtral`): every layer is the shared sparse block with
experts as wide as ``intermediate_size`` and always-renormalised top-k weights, the hub's
``block_sparse_moe.experts.e.w1/w3/w2`` names are written and read (transformers 5's fused
tensors too), what is not computed is refused by name, and, where a Python with torch and
transformers is found, transformers' `MixtralForCausalLM` computes the same logits, both ways."""
import numpy as np
import pytest

from ppo.models import hf_files, hf_format
from ppo.models.hf_convert import export_model
from ppo.models.hf_import import load_hf_model
from tests.hf_weights_helpers import (PAD, SIZES, causal_logits, family_score_model, hf_python, randomize,
                                      transformers_round_trip)

TRANSFORMERS_ATOL = 1e-4  # float32, torch vs Paddle kernels
def mixtral_model(tied=False, seed=0, **overrides):
    from ppo.models.families.mixtral_modeling import MixtralConfig, MixtralForCausalLM

    fields = dict(SIZES, intermediate_size=24, tie_word_embeddings=tied, rope_theta=5000.0, pad_token_id=PAD,
                  dtype="float32", num_local_experts=4, num_experts_per_tok=2)
    return randomize(MixtralForCausalLM(MixtralConfig(**{**fields, **overrides})), seed)


@pytest.mark.parametrize("tied, layout", [(True, "transformers5"), (False, "transformers4")])
def test_export_writes_the_hub_names_and_imports_back_exactly(tmp_path, tied, layout):
    from ppo.models.families.moe import SparseMoeBlock

    model = mixtral_model(tied=tied)
    assert all(isinstance(layer.mlp, SparseMoeBlock) and layer.mlp.norm_topk_prob for layer in model.mixtral.layers)
    config = export_model(model, str(tmp_path))
    assert config["architectures"] == ["MixtralForCausalLM"] and config["num_local_experts"] == 4
    tensors = hf_files.read_safetensors(str(tmp_path))
    shapes = {n: tuple(v.shape) for n, v in tensors.items()}
    assert shapes == hf_format.expected_hf_shapes(config)
    assert shapes["model.layers.1.block_sparse_moe.experts.3.w2.weight"] == (32, 24)
    config.pop("rope_parameters" if layout == "transformers4" else "rope_theta")
    hf_files.write_json(config, str(tmp_path / "config.json"))
    back = load_hf_model(str(tmp_path))
    assert back.config.rope_theta == 5000.0 and (back.lm_head.weight is back.mixtral.embed_tokens.weight) == tied
    assert np.abs(causal_logits(back) - causal_logits(model)).max() == 0.0
    fused = {n: v for n, v in tensors.items() if ".experts." not in n}  # transformers 5's in-memory layout
    for layer in (0, 1):
        p = f"model.layers.{layer}.block_sparse_moe.experts."
        fused[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([tensors[f"{p}{e}.w1.weight"], tensors[f"{p}{e}.w3.weight"]]) for e in range(4)])
        fused[f"model.layers.{layer}.mlp.experts.down_proj"] = np.stack([tensors[f"{p}{e}.w2.weight"] for e in range(4)])
    state = hf_format.paddle_tensors(fused, dict(config, model_type="mixtral"))
    for name, value in model.state_dict().items():
        if name != "lm_head.weight" or not tied:
            np.testing.assert_array_equal(state[name], value.numpy(), err_msg=name)


@pytest.mark.parametrize("change, named", [({"sliding_window": 4096}, "sliding_window 4096"),
                                           ({"router_jitter_noise": 0.1}, "router_jitter_noise 0.1")])
def test_fields_not_computed_here_are_refused_by_name(tmp_path, change, named):
    config = export_model(mixtral_model(), str(tmp_path))
    hf_files.write_json(dict(config, **change), str(tmp_path / "config.json"))
    with pytest.raises(ValueError, match=f"MixtralForCausalLM config: not supported here: {named}"):
        load_hf_model(str(tmp_path))


HF_SIZES = dict(vocab_size=50, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, pad_token_id=PAD, num_local_experts=4,
                num_experts_per_tok=2)


@pytest.mark.skipif(hf_python() is None, reason="no Python with torch and transformers (set PADDLE_ALIGN_HF_PYTHON)")
def test_transformers_computes_the_same_logits_both_ways(tmp_path):
    ours = {"tied": mixtral_model(tied=True), "untied": mixtral_model(seed=3, head_dim=16)}
    built = {
        "hf_tied_v5": dict(HF_SIZES, model_type="mixtral", tie_word_embeddings=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 3000.0}),
        "hf_untied_v4": dict(HF_SIZES, model_type="mixtral", tie_word_embeddings=False, head_dim=16,
                             rope_parameters={"rope_type": "default", "rope_theta": 7000.0}),
    }
    scorer = family_score_model("mixtral", mixtral_model(seed=5).config)
    out, diffs = transformers_round_trip(ours, built, tmp_path, scorer=scorer)
    print("max |logit diff| vs transformers:", diffs)
    assert max(diffs.values()) <= TRANSFORMERS_ATOL, diffs
    assert [str(o["class_name"]) for o in out] == ["MixtralForCausalLM"] * 4 + ["MixtralForSequenceClassification"]
    assert [bool(o["tied"]) for o in out] == [True, False, True, False, False]
    assert out[3]["ours"].config.head_dim == 16 and out[2]["ours"].config.head_dim == 8


def test_a_paddlenlp_mixtral_checkpoint_loads_into_ours_renamed(tmp_path):
    """PaddleNLP's layout (``block_sparse_moe.experts.e.w1/w3/w2``) loads with every weight in
    place (its own forward does not run under Paddle 3.3.1, so weights are compared)."""
    from paddlenlp.transformers import MixtralConfig, MixtralForCausalLM

    from ppo.models.families import causal_lm_from_pretrained

    config = MixtralConfig(**dict(SIZES, intermediate_size=24), num_local_experts=4, num_experts_per_tok=2,
                           rope_theta=5000.0, pad_token_id=PAD, tie_word_embeddings=False, dtype="float32")
    theirs = randomize(MixtralForCausalLM(config), 2)
    theirs.save_pretrained(str(tmp_path))
    ours = causal_lm_from_pretrained(str(tmp_path))
    state, loaded = theirs.state_dict(), ours.state_dict()
    assert len(state) == len(loaded)
    for i in range(2):
        p = f"mixtral.layers.{i}."
        pairs = [("block_sparse_moe.gate", "mlp.gate")] + [
            (f"block_sparse_moe.experts.{e}.{w}", f"mlp.experts.{e}.{name}")
            for e in range(4) for w, name in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))]
        for old, new in pairs:
            np.testing.assert_array_equal(loaded[p + new + ".weight"].numpy(), state[p + old + ".weight"].numpy())
    np.testing.assert_array_equal(loaded["lm_head.weight"].numpy(), state["lm_head.weight"].numpy())
