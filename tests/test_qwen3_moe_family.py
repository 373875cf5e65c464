"""The Qwen3-MoE family (`ppo.models.families.qwen3_moe`): the sparse block routes each token to its
top-k experts and computes only those (equal to a dense sum over the chosen experts), routing replay
uses given experts with the current router's weights, the load-balancing loss is transformers'
formula, sparse and dense layers sit where `decoder_sparse_step` / `mlp_only_layers` put them, Hugging
Face export -> import is exact (tied and untied, both rope layouts, transformers 5's fused expert
tensors too), and where a Python with torch and transformers is found, transformers'
`Qwen3MoeForCausalLM` computes the same logits as ours, both ways."""
import json

import numpy as np
import paddle
import pytest

from ppo.models import hf_files, hf_format
from ppo.models.hf_convert import export_model
from ppo.models.hf_import import load_hf_model
from tests.hf_weights_helpers import IDS, MASK, PAD, SIZES, causal_logits, end_scores, hf_python, randomize, run_transformers

TRANSFORMERS_ATOL = 1e-4  # float32, torch vs Paddle kernels
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True)


def moe_config(tied=False, **overrides):
    from ppo.models.families.qwen3_moe_modeling import Qwen3MoeConfig

    fields = dict(SIZES, num_hidden_layers=3, head_dim=16, tie_word_embeddings=tied, rms_norm_eps=1e-6,
                  rope_theta=5000.0, pad_token_id=PAD, bos_token_id=1, eos_token_id=2, dtype="float32",
                  mlp_only_layers=[0], **MOE)
    return Qwen3MoeConfig(**{**fields, **overrides})


def moe_model(tied=False, seed=0, **overrides):
    from ppo.models.families.qwen3_moe_modeling import Qwen3MoeForCausalLM

    return randomize(Qwen3MoeForCausalLM(moe_config(tied, **overrides)), seed)


def dense_reference(block, x):
    """Every expert on every token, then the top-k softmax weights (renormalised): [N, H]."""
    probs = paddle.nn.functional.softmax(block.gate(x), axis=-1).numpy()
    every = np.stack([expert(x).numpy() for expert in block.experts], axis=1)  # [N, E, H]
    out = np.zeros_like(x.numpy())
    for n in range(x.shape[0]):
        top = np.argsort(-probs[n])[:block.top_k]
        w = probs[n, top] / (probs[n, top].sum() if block.norm_topk_prob else 1.0)
        out[n] = (w[:, None] * every[n, top]).sum(0)
    return out


@pytest.mark.parametrize("norm", [True, False])
def test_the_sparse_block_equals_the_dense_sum_over_the_chosen_experts(norm):
    from ppo.models.families.moe import SparseMoeBlock

    paddle.seed(3)
    block = SparseMoeBlock(moe_config(norm_topk_prob=norm))
    x = paddle.randn([2, 5, 32])
    out, logits, indices = block(x)
    assert out.shape == [2, 5, 32] and logits.shape == [10, 4] and indices.shape == [10, 2]
    np.testing.assert_allclose(out.reshape([10, 32]).numpy(), dense_reference(block, x.reshape([10, 32])),
                               rtol=1e-5, atol=1e-6)


def test_experts_run_only_on_the_tokens_routed_to_them():
    from ppo.models.families.moe import SparseMoeBlock

    paddle.seed(4)
    block = SparseMoeBlock(moe_config())
    seen = {e: 0 for e in range(4)}
    for e, expert in enumerate(block.experts):
        expert.register_forward_pre_hook(lambda layer, inputs, e=e: seen.__setitem__(e, seen[e] + inputs[0].shape[0]))
    _, _, indices = block(paddle.randn([1, 6, 32]))
    expected = np.bincount(indices.numpy().reshape(-1), minlength=4)
    assert [seen[e] for e in range(4)] == expected.tolist() and sum(seen.values()) == 12  # not 4 x 6 = 24


def test_replayed_experts_take_the_current_routers_weights_and_keep_its_gradient():
    from ppo.models.families.moe import SparseMoeBlock, route

    paddle.seed(5)
    block = SparseMoeBlock(moe_config())
    x = paddle.randn([1, 4, 32])
    given = paddle.to_tensor([[3, 0], [1, 2], [0, 1], [2, 3]], dtype="int64")
    out, logits, used = block(x, expert_indices=given)
    np.testing.assert_array_equal(used.numpy(), given.numpy())
    weights, _ = route(logits, 2, True, given)
    probs = paddle.nn.functional.softmax(logits, axis=-1).numpy()
    picked = np.take_along_axis(probs, given.numpy(), axis=1)
    np.testing.assert_allclose(weights.numpy(), picked / picked.sum(1, keepdims=True), rtol=1e-6)
    manual = sum(weights[:, j:j + 1].numpy() * np.stack([block.experts[int(given[n, j])](x[0, n:n + 1]).numpy()[0]
                                                          for n in range(4)]) for j in range(2))
    np.testing.assert_allclose(out[0].numpy(), manual, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert float(block.gate.weight.grad.abs().sum()) > 0


def hf_load_balancing_loss(router_logits, num_experts, top_k, mask):
    """transformers 5.23's `load_balancing_loss_func` (masked branch), transcribed in numpy."""
    tokens, probs_sum, rows = np.zeros(num_experts), np.zeros(num_experts), 0.0
    flat = mask.reshape(-1).astype("float64")
    for g in router_logits:
        p = np.exp(g - g.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        top = np.argsort(-p, axis=-1)[:, :top_k]
        np.add.at(tokens, top.reshape(-1), np.repeat(flat, top_k))
        probs_sum += (p * flat[:, None]).sum(0)
        rows += flat.sum()
    return float((tokens / rows * probs_sum / rows).sum() * num_experts)


def test_load_balancing_loss_is_transformers_formula_and_z_loss_is_st_moes():
    from ppo.models.families.moe import load_balancing_loss, moe_losses, router_z_loss

    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(16, 4)).astype("float32") for _ in range(2)]
    mask = (rng.random(16) > 0.3).astype("int64")
    ours = float(load_balancing_loss([paddle.to_tensor(g) for g in logits], 4, 2, paddle.to_tensor(mask)))
    assert abs(ours - hf_load_balancing_loss(logits, 4, 2, mask)) < 1e-6
    balanced = [paddle.zeros([8, 4])]  # uniform router: f_e = k / E, P_e = 1 / E -> loss = k
    assert abs(float(load_balancing_loss(balanced, 4, 2)) - 2.0) < 1e-6
    lse = np.log(np.exp(np.concatenate(logits)).sum(-1))
    assert abs(float(router_z_loss([paddle.to_tensor(g) for g in logits])) - float((lse ** 2).mean())) < 1e-5
    config = moe_config(router_aux_loss_coef=0.5, router_z_loss_coef=0.25)
    loss, stats = moe_losses([paddle.to_tensor(g) for g in logits], config)
    expected = 0.5 * float(stats["moe/aux_loss"]) + 0.25 * float(stats["moe/z_loss"])
    assert abs(float(loss) - expected) < 1e-6 and float(stats["moe/dropped_tokens"]) == 0.0
    counts = np.bincount(np.argsort(-np.concatenate(logits), axis=-1)[:, :2].reshape(-1), minlength=4)
    assert abs(float(stats["moe/expert_load_max_over_mean"]) - counts.max() / counts.mean()) < 1e-5


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    from ppo.models.families.moe import SparseMoeBlock

    model = moe_model(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])
    kinds = [isinstance(layer.mlp, SparseMoeBlock) for layer in model.qwen3_moe.layers]
    assert kinds == [False, True, False, False]
    assert list(model.qwen3_moe.layers[0].mlp.gate_proj.weight.shape) == [32, 48]
    assert list(model.qwen3_moe.layers[1].mlp.experts[3].down_proj.weight.shape) == [24, 32]


def test_the_forward_returns_router_logits_and_the_weighted_aux_loss():
    model = moe_model(output_router_logits=True, router_aux_loss_coef=0.1)
    out = model(input_ids=paddle.to_tensor(IDS), attention_mask=paddle.to_tensor(MASK), return_dict=True)
    assert len(out.router_logits) == 2 and out.router_logits[0].shape == [16, 4]
    from ppo.models.families.moe import load_balancing_loss

    aux = load_balancing_loss(out.router_logits, 4, 2, paddle.to_tensor(MASK))
    assert abs(float(out.aux_loss) - 0.1 * float(aux)) < 1e-7 and float(aux) > 0
    assert [i.shape for i in model.last_expert_indices()] == [[16, 2], [16, 2]]
    replayed = [paddle.flip(i, axis=[1]) for i in model.last_expert_indices()]  # same experts, same logits
    again = model(input_ids=paddle.to_tensor(IDS), attention_mask=paddle.to_tensor(MASK), moe_expert_indices=replayed, return_dict=True)
    np.testing.assert_allclose(again.logits.numpy(), out.logits.numpy(), rtol=1e-5, atol=1e-6)
    other = [(i + 1) % 4 for i in model.last_expert_indices()]
    moved = model(input_ids=paddle.to_tensor(IDS), attention_mask=paddle.to_tensor(MASK), moe_expert_indices=other, return_dict=True)
    assert np.abs(moved.logits.numpy() - out.logits.numpy()).max() > 1e-3


@pytest.mark.parametrize("tied", [True, False])
def test_export_then_import_gives_identical_logits(tmp_path, tied):
    model = moe_model(tied=tied)
    config = export_model(model, str(tmp_path))
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts"] == config["num_local_experts"] == 4
    assert config["mlp_only_layers"] == [0] and config["norm_topk_prob"] is True
    shapes = {n: tuple(v.shape) for n, v in hf_files.read_safetensors(str(tmp_path)).items()}
    assert shapes == hf_format.expected_hf_shapes(config)
    assert shapes["model.layers.1.mlp.gate.weight"] == (4, 32)
    assert shapes["model.layers.2.mlp.experts.3.down_proj.weight"] == (32, 24)
    assert "model.layers.1.mlp.gate_proj.weight" not in shapes and shapes["model.layers.0.mlp.gate_proj.weight"] == (48, 32)
    back = load_hf_model(str(tmp_path))
    assert np.abs(causal_logits(back) - causal_logits(model)).max() == 0.0
    assert (back.lm_head.weight is back.qwen3_moe.embed_tokens.weight) == tied


def test_transformers5_fused_expert_tensors_import_the_same(tmp_path):
    model = moe_model()
    export_model(model, str(tmp_path / "split"))
    tensors = hf_files.read_safetensors(str(tmp_path / "split"))
    fused = {}
    for name, value in tensors.items():
        if ".mlp.experts." not in name:
            fused[name] = value
    for layer in (1, 2):
        p = f"model.layers.{layer}.mlp.experts."
        fused[p + "gate_up_proj"] = np.stack([np.concatenate([tensors[f"{p}{e}.gate_proj.weight"],
                                                              tensors[f"{p}{e}.up_proj.weight"]]) for e in range(4)])
        fused[p + "down_proj"] = np.stack([tensors[f"{p}{e}.down_proj.weight"] for e in range(4)])
    back = hf_format.paddle_tensors(fused, {"model_type": "qwen3_moe", "tie_word_embeddings": False})
    state = model.state_dict()
    assert sorted(back) == sorted(n for n in state if "rotary" not in n)
    for name, value in back.items():
        np.testing.assert_array_equal(value, state[name].numpy(), err_msg=name)


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_both_config_layouts_and_num_local_experts_read_the_same(tmp_path, layout):
    model = moe_model()
    config = export_model(model, str(tmp_path))
    if layout == "transformers4":
        config.pop("rope_parameters")
        config.pop("layer_types")
        config.pop("num_local_experts")
    else:
        config.pop("rope_theta")
        config.pop("rope_scaling")
        config.pop("num_experts")
    hf_files.write_json(config, str(tmp_path / "config.json"))
    back = load_hf_model(str(tmp_path))
    assert back.config.rope_theta == 5000.0 and back.config.num_experts == 4
    np.testing.assert_array_equal(causal_logits(back), causal_logits(model))


def test_score_model_on_the_moe_backbone_round_trips(tmp_path):
    from ppo.models.score_model import SCORE_CONFIG_DEFAULTS, score_model_class

    config = moe_config()
    for key, value in SCORE_CONFIG_DEFAULTS.items():
        setattr(config, key, value)
    scorer = randomize(score_model_class("qwen3_moe")(config), 1)
    exported = export_model(scorer, str(tmp_path))
    assert exported["architectures"] == ["Qwen3MoeForSequenceClassification"]
    back = load_hf_model(str(tmp_path))
    assert type(back).__name__ == "Qwen3MoeModelForScore"
    np.testing.assert_array_equal(end_scores(back), end_scores(scorer))


HF_SIZES = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=PAD,
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1])


@pytest.mark.skipif(hf_python() is None, reason="no Python with torch and transformers (set PADDLE_ALIGN_HF_PYTHON)")
def test_transformers_computes_the_same_logits_both_ways(tmp_path):
    ours = {"tied": moe_model(tied=True), "untied": moe_model(tied=False, seed=3, norm_topk_prob=False)}
    jobs = []
    for name, model in ours.items():
        export_model(model, str(tmp_path / name))
        jobs.append({"dir": str(tmp_path / name), "kind": "causal"})
    built = {  # written by transformers 5, one in each config layout
        "hf_tied_v5": dict(HF_SIZES, model_type="qwen3_moe", tie_word_embeddings=True, norm_topk_prob=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 3000.0}),
        "hf_untied_v4": dict(HF_SIZES, model_type="qwen3_moe", tie_word_embeddings=False, decoder_sparse_step=2,
                             rope_parameters={"rope_type": "default", "rope_theta": 7000.0}),
    }
    for name, config in built.items():
        jobs.append({"dir": str(tmp_path / name), "kind": "build", "config": config, "seed": len(jobs),
                     "legacy_rope": name.endswith("v4")})
    from ppo.models.score_model import SCORE_CONFIG_DEFAULTS, score_model_class

    config = moe_config()
    for key, value in {**SCORE_CONFIG_DEFAULTS, "do_normalize": False}.items():
        setattr(config, key, value)
    scorer = randomize(score_model_class("qwen3_moe")(config), 1)
    export_model(scorer, str(tmp_path / "score"))
    out = run_transformers(jobs + [{"dir": str(tmp_path / "score"), "kind": "score"}], tmp_path)
    bias = float(scorer.score_head.bias.numpy()[0])  # transformers' score layer has no bias
    assert str(out[-1]["class_name"]) == "Qwen3MoeForSequenceClassification"
    assert np.abs(out[-1]["scores"] + bias - end_scores(scorer)).max() <= TRANSFORMERS_ATOL
    for i, model in enumerate(ours.values()):
        assert str(out[i]["class_name"]) == "Qwen3MoeForCausalLM" and bool(out[i]["tied"]) == (i == 0)
        diff = np.abs(out[i]["logits"] * MASK[..., None] - causal_logits(model, mask=MASK)).max()
        assert diff <= TRANSFORMERS_ATOL, diff
    for i, name in enumerate(built, start=len(ours)):
        saved = json.load(open(tmp_path / name / "config.json"))
        assert ("rope_parameters" in saved) == name.endswith("v5")
        back = load_hf_model(str(tmp_path / name))
        assert back.config.rope_theta == built[name]["rope_parameters"]["rope_theta"]
        assert (back.lm_head.weight is back.qwen3_moe.embed_tokens.weight) == bool(out[i]["tied"])
        diff = np.abs(out[i]["logits"] * MASK[..., None] - causal_logits(back, mask=MASK)).max()
        assert diff <= TRANSFORMERS_ATOL, (name, diff)


@pytest.mark.parametrize("family, granularity", [("qwen3_moe", "full"), ("qwen3_moe", "full_attn"),
                                                 ("qwen3_moe", "core_attn"), ("ernie4_5_moe", "full")])
def test_recompute_gives_the_same_gradients_router_included(family, granularity):
    from ppo.models.loading import enable_recompute
    from tests.test_ernie45_moe_family import ernie_moe_model

    build = {"qwen3_moe": moe_model, "ernie4_5_moe": ernie_moe_model}[family]
    grads = []
    for recompute in (False, True):
        model = build(output_router_logits=True, router_aux_loss_coef=1.0)
        model.train()
        if recompute:
            assert enable_recompute(model, granularity) >= 2
        out = model(input_ids=paddle.to_tensor(IDS), attention_mask=paddle.to_tensor(MASK), return_dict=True)
        (out.logits.square().mean() + out.aux_loss).backward()
        grads.append({n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None})
    prefix = model.base_model_prefix
    assert len(grads[1]) == len(grads[0]) > 20 and f"{prefix}.layers.1.mlp.gate.weight" in grads[0]
    for name, grad in grads[0].items():
        np.testing.assert_allclose(grads[1][name], grad, rtol=1e-5, atol=1e-7, err_msg=name)


def test_moe_settings_on_a_dense_qwen3_are_refused_by_name(tmp_path):
    from tests.test_qwen3_family import qwen3_model

    config = export_model(qwen3_model(), str(tmp_path))
    hf_files.write_json(dict(config, num_experts=8, num_experts_per_tok=2), str(tmp_path / "config.json"))
    with pytest.raises(ValueError, match=r"Qwen3ForCausalLM config: not supported here: num_experts, num_experts_per_tok "
                                         r"on a dense model \(model_type qwen3; the MoE family is qwen3_moe\)"):
        load_hf_model(str(tmp_path))


def test_a_resume_names_another_expert_count(tmp_path):
    from ppo.checkpoints.resume_check import fact_differences, model_facts, saved_model_facts

    moe_model().save_pretrained(str(tmp_path))
    found = fact_differences(saved_model_facts(str(tmp_path)), model_facts(moe_model(num_experts=8)), "model")
    assert found == ["model: num_experts is 4 in the checkpoint but 8 in this run"]
