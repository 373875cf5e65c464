"""Hugging Face safetensors export (scripts/export_hf.py) and import (scripts/import_hf.py, or a
Hugging Face directory given as a model path): tiny Llama and Qwen2 models with random weights
give the same logits after export -> import (fused q/k/v and gate/up layouts, tied and untied
heads, float32/float16/bfloat16 kept bit for bit), a LoRA adapter is exported merged, a score
model keeps its scores and normaliser, every exported tensor has the name and shape
transformers' LlamaForCausalLM / Qwen2ForCausalLM / *ForSequenceClassification declare, and,
where a Python with torch and transformers is found (this interpreter, or the one named by
PADDLE_ALIGN_HF_PYTHON), transformers loads the export and computes the same logits."""
import json
import os

import numpy as np
import paddle
import pytest

from ppo.models import hf_files, hf_format
from ppo.models.hf_convert import export_dir, export_model, is_hf_dir
from ppo.models.hf_import import load_hf_model
from tests.hf_weights_helpers import (
    LONG_IDS, MASK, causal_logits, end_scores, hf_python, run_transformers, score_model, tiny_model,
)

ROUND_TRIP_RTOL = 1e-5
TRANSFORMERS_ATOL = 1e-5  # float32 sums in another order (torch vs Paddle kernels); measured <= 3.2e-6


def exported_shapes(path):
    return {name: tuple(value.shape) for name, value in hf_files.read_safetensors(path).items()}


CASES = [  # (model type, fused q/k/v and gate/up, tied embeddings)
    ("llama", False, False), ("llama", True, False), ("llama", False, True),
    ("qwen2", False, True), ("qwen2", True, False),
]


@pytest.mark.parametrize("kind,fused,tied", CASES)
def test_export_then_import_gives_identical_logits(tmp_path, kind, fused, tied):
    model = tiny_model(kind, fused=fused, tied=tied)
    config = export_model(model, str(tmp_path))
    assert config["architectures"] == [hf_format.CAUSAL_LM_ARCH[kind]] and config["tie_word_embeddings"] == tied
    assert exported_shapes(str(tmp_path)) == hf_format.expected_hf_shapes(config)
    assert is_hf_dir(str(tmp_path))
    back = load_hf_model(str(tmp_path))
    assert not getattr(back.config, "fuse_attention_qkv", False)
    expected, got = causal_logits(model), causal_logits(back)
    np.testing.assert_allclose(got, expected, rtol=ROUND_TRIP_RTOL, atol=0)
    assert np.abs(got - expected).max() == 0.0  # renaming and transposing is exact
    assert (back.lm_head.weight is back.get_input_embeddings().weight) == tied


@pytest.mark.parametrize("rope,hf_rope", [
    ("linear", {"rope_type": "linear", "factor": 2.0}),
    ("llama3", {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 16}),
])
def test_rotary_scaling_survives_the_round_trip(tmp_path, rope, hf_rope):
    model = tiny_model("llama", rope=rope)
    assert export_model(model, str(tmp_path))["rope_scaling"] == hf_rope
    back = load_hf_model(str(tmp_path))
    assert type(back.llama.layers[0].self_attn.rotary_emb) is type(model.llama.layers[0].self_attn.rotary_emb)
    np.testing.assert_array_equal(causal_logits(back, ids=LONG_IDS), causal_logits(model, ids=LONG_IDS))


# What transformers 4.56 declares for these configs (LlamaForCausalLM / Qwen2ForCausalLM /
# Qwen2ForSequenceClassification state_dict(), vocabulary 50, hidden 32, intermediate 48,
# 1 layer, 4 query / 2 KV heads); a tied lm_head is not stored in the files.
LAYER = {"self_attn.q_proj.weight": (32, 32), "self_attn.k_proj.weight": (16, 32), "self_attn.v_proj.weight": (16, 32),
         "self_attn.o_proj.weight": (32, 32), "mlp.gate_proj.weight": (48, 32), "mlp.up_proj.weight": (48, 32),
         "mlp.down_proj.weight": (32, 48), "input_layernorm.weight": (32,), "post_attention_layernorm.weight": (32,)}
QWEN2_BIASES = {"self_attn.q_proj.bias": (32,), "self_attn.k_proj.bias": (16,), "self_attn.v_proj.bias": (16,)}
OUTER = {"model.embed_tokens.weight": (50, 32), "model.norm.weight": (32,)}
TRANSFORMERS_NAMES = {
    "llama": {**OUTER, **{f"model.layers.0.{k}": v for k, v in LAYER.items()}, "lm_head.weight": (50, 32)},
    "qwen2": {**OUTER, **{f"model.layers.0.{k}": v for k, v in {**LAYER, **QWEN2_BIASES}.items()}},
    "qwen2-score": {**OUTER, **{f"model.layers.0.{k}": v for k, v in {**LAYER, **QWEN2_BIASES}.items()},
                    "score.weight": (1, 32)},
}


@pytest.mark.parametrize("case", sorted(TRANSFORMERS_NAMES))
def test_every_tensor_has_the_name_and_shape_transformers_declares(tmp_path, case):
    kind = case.split("-")[0]
    small = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1)
    if case.endswith("score"):
        model = score_model(kind, score_bias=False, **small)
    else:
        model = tiny_model(kind, fused=True, tied=kind == "qwen2", **small)
    config = export_model(model, str(tmp_path))
    assert exported_shapes(str(tmp_path)) == TRANSFORMERS_NAMES[case]
    assert hf_format.expected_hf_shapes(config) == TRANSFORMERS_NAMES[case]


@pytest.mark.parametrize("dtype,code", [("bfloat16", "BF16"), ("float16", "F16")])
def test_half_precision_weights_keep_their_dtype_and_bits(tmp_path, dtype, code):
    model = tiny_model("qwen2", dtype=dtype)
    export_model(model, str(tmp_path))
    _, header = hf_files._header(os.path.join(str(tmp_path), hf_files.SAFE_WEIGHTS))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {code}
    assert header["__metadata__"] == {"format": "pt"}
    assert json.load(open(tmp_path / "config.json"))["torch_dtype"] == dtype
    back = load_hf_model(str(tmp_path))
    assert back.qwen2.embed_tokens.weight.dtype == getattr(paddle, dtype)
    before, after = model.state_dict(), back.state_dict()
    for name, value in before.items():
        if "inv_freq" not in name:
            np.testing.assert_array_equal(after[name].numpy(), value.numpy(), err_msg=name)
    as_float32 = load_hf_model(str(tmp_path), dtype="float32")
    assert as_float32.qwen2.embed_tokens.weight.dtype == paddle.float32


def test_large_models_are_sharded_with_an_index(tmp_path):
    model = tiny_model("llama", num_hidden_layers=3)
    total = sum(int(np.prod(p.shape)) * 4 for n, p in model.state_dict().items() if "inv_freq" not in n)
    files = hf_files.write_safetensors(
        hf_format.hf_tensors({n: v.numpy() for n, v in model.state_dict().items()}, model.config.to_dict()),
        str(tmp_path / "raw"), max_shard_bytes=total // 3)
    assert files[-1] == hf_files.SAFE_INDEX and len(files) >= 4
    export_model(model, str(tmp_path / "hf"), max_shard_bytes=total // 3)
    index = json.load(open(tmp_path / "hf" / hf_files.SAFE_INDEX))
    shards = sorted(set(index["weight_map"].values()))
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors" and len(shards) >= 3
    assert not (tmp_path / "hf" / hf_files.SAFE_WEIGHTS).exists()
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"]) == set(exported_shapes(str(tmp_path / "hf")))
    export_model(model, str(tmp_path / "hf"))  # re-export unsharded: the old shards go
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "generation_config.json", "model.safetensors"]
    np.testing.assert_array_equal(causal_logits(load_hf_model(str(tmp_path / "hf"))), causal_logits(model))


def test_a_lora_adapter_is_exported_merged(tmp_path):
    from ppo.models.adapters import load_merged_causal_lm
    from ppo.models.loading import apply_lora, load_causal_lm

    base_dir, adapter_dir, out = (str(tmp_path / n) for n in ("base", "adapter", "hf"))
    tiny_model("llama").save_pretrained(base_dir)
    lora = apply_lora(load_causal_lm(base_dir), rank=4, base_model_name_or_path=base_dir)
    paddle.seed(3)
    with paddle.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.set_value(paddle.randn(param.shape) * 0.5)
    lora.save_pretrained(adapter_dir)
    export_dir(adapter_dir, out)
    assert exported_shapes(out) == hf_format.expected_hf_shapes(json.load(open(f"{out}/config.json")))
    exported = causal_logits(load_hf_model(out))
    np.testing.assert_allclose(exported, causal_logits(load_merged_causal_lm(adapter_dir)), rtol=ROUND_TRIP_RTOL, atol=0)
    # the unmerged adapter computes x W + (x A) B s: the same up to float32 rounding (measured 5e-6)
    np.testing.assert_allclose(exported, causal_logits(lora), rtol=0, atol=5e-5)
    base_only = causal_logits(load_causal_lm(base_dir))
    assert np.abs(exported - base_only).max() > 1e-2  # the adapter changed the model, and the export kept it


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_score_model_keeps_its_scores_head_and_normaliser(tmp_path, kind):
    from ppo.models.adapters import load_score_model

    model = score_model(kind, do_normalize=True, normalizer_type="ExponentialMovingAverage", score_type="cost")
    src = str(tmp_path / "ours")
    model.save_pretrained(src)
    export_dir(src, str(tmp_path / "hf"))
    config = json.load(open(tmp_path / "hf" / "config.json"))
    assert config["architectures"] == [hf_format.SCORE_ARCH[kind]] and config["num_labels"] == 1
    assert config["score_type"] == "cost" and config["do_normalize"] is True
    assert config["normalizer_mean"] == pytest.approx(0.75) and config["normalizer_var"] == pytest.approx(4.0)
    shapes = exported_shapes(str(tmp_path / "hf"))
    assert shapes == {**hf_format.expected_hf_shapes(config), "score.bias": (1,)}
    back = load_score_model(str(tmp_path / "hf"))
    assert back.config.score_type == "cost" and back.config.normalizer_type == "ExponentialMovingAverage"
    np.testing.assert_allclose(end_scores(back), end_scores(model), rtol=ROUND_TRIP_RTOL, atol=0)
    raw = end_scores(model, normalized=False)
    assert not np.allclose(end_scores(model), raw)  # the normaliser is on, so keeping it is tested


def test_a_causal_lm_directory_starts_a_score_model_with_a_new_head(tmp_path):
    from ppo.models.adapters import load_score_model

    lm = tiny_model("qwen2", tied=True)
    export_model(lm, str(tmp_path))
    paddle.seed(5)
    rm = load_score_model(str(tmp_path), score_type="reward")
    np.testing.assert_array_equal(rm.qwen2.embed_tokens.weight.numpy(), lm.qwen2.embed_tokens.weight.numpy())
    assert float(paddle.abs(rm.score_head.weight).max()) > 0


def test_model_paths_may_name_a_hugging_face_directory(tmp_path, tiny_model_dir):
    from ppo.common.validation import check_model_dir
    from ppo.models.loading import load_causal_lm, load_tokenizer

    hf = str(tmp_path / "hf")
    export_dir(tiny_model_dir, hf)
    check_model_dir("model_name_or_path", hf)
    ours = load_causal_lm(tiny_model_dir)
    ids = [[1, 4, 7, 30, 31, 2, 9]]
    np.testing.assert_array_equal(causal_logits(load_causal_lm(hf), ids), causal_logits(ours, ids))
    text = "USER: Reverse: k3x9q ASSISTANT:"
    assert load_tokenizer(hf)(text)["input_ids"] == load_tokenizer(tiny_model_dir)(text)["input_ids"]
    assert open(f"{hf}/tokenizer.model", "rb").read() == open(f"{tiny_model_dir}/sentencepiece.bpe.model", "rb").read()
    with pytest.raises(ValueError, match="a score model, not a causal LM"):
        score = str(tmp_path / "score")
        export_model(score_model("llama"), score)
        load_causal_lm(score)
    from ppo.strategy.pipeline.pipe import refuse_hf_dir

    with pytest.raises(ValueError, match="scripts/import_hf.py"):  # pipeline stages load PaddleNLP checkpoints
        refuse_hf_dir(hf)
    refuse_hf_dir(tiny_model_dir)
    with pytest.raises(ValueError, match="tensor_parallel_degree > 1 convert it first"):
        load_causal_lm(hf, tensor_parallel_degree=2, tensor_parallel_rank=0)


def test_import_script_writes_our_layout(tmp_path, tiny_model_dir):
    from paddlenlp.transformers import AutoModelForCausalLM
    from scripts.export_hf import main as export_main
    from scripts.import_hf import main as import_main

    hf, ours = str(tmp_path / "hf"), str(tmp_path / "ours")
    export_main(["--model_path", tiny_model_dir, "--output_dir", hf, "--dtype", "bfloat16"])
    assert json.load(open(f"{hf}/config.json"))["dtype"] == "bfloat16"
    import_main(["--hf_path", hf, "--output_dir", ours])
    assert os.path.isfile(f"{ours}/model_state.pdparams") and os.path.isfile(f"{ours}/sentencepiece.bpe.model")
    reloaded = AutoModelForCausalLM.from_pretrained(ours, dtype="bfloat16").state_dict()
    for name, value in load_hf_model(hf).state_dict().items():  # (no bfloat16 matmul on CPU: compare bits)
        assert value.dtype == paddle.bfloat16
        np.testing.assert_array_equal(reloaded[name].numpy(), value.numpy(), err_msg=name)
    with pytest.raises(SystemExit):
        import_main(["--hf_path", ours, "--output_dir", str(tmp_path / "again")])  # not a Hugging Face directory


@pytest.mark.parametrize("change,match", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"head_dim": 16}, "head_dim"),
    ({"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, "use_sliding_window"),
    ({"model_type": "mistral"}, "model_type"),
])
def test_configs_paddlenlp_cannot_compute_are_refused(tmp_path, change, match):
    export_model(tiny_model("qwen2"), str(tmp_path))
    config = json.load(open(tmp_path / "config.json"))
    json.dump({**config, **change}, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match=match):
        load_hf_model(str(tmp_path))


def test_an_unknown_tensor_is_an_error_not_dropped(tmp_path):
    model = tiny_model("llama")
    tensors = hf_format.hf_tensors({n: v.numpy() for n, v in model.state_dict().items()}, model.config.to_dict())
    tensors["model.layers.0.self_attn.extra.weight"] = np.zeros([2, 2], np.float32)
    export_model(model, str(tmp_path))
    hf_files.write_safetensors(tensors, str(tmp_path))
    with pytest.raises(ValueError, match="self_attn.extra.weight"):
        load_hf_model(str(tmp_path))


@pytest.mark.skipif(hf_python() is None, reason="no Python with torch and transformers (set PADDLE_ALIGN_HF_PYTHON)")
def test_transformers_loads_the_export_with_the_same_outputs(tmp_path, tiny_model_dir):
    from ppo.tiny.factory import build_real_shape

    models = {"llama": tiny_model("llama", fused=True), "qwen2": tiny_model("qwen2", tied=True)}
    jobs = []
    for name, model in models.items():
        export_model(model, str(tmp_path / name))
        jobs.append({"dir": str(tmp_path / name), "kind": "causal"})
    scaled = {rope: tiny_model("llama", rope=rope) for rope in ("linear", "llama3")}
    for rope, model in scaled.items():
        export_model(model, str(tmp_path / rope))
        jobs.append({"dir": str(tmp_path / rope), "kind": "causal", "input_ids": LONG_IDS.tolist(),
                     "attention_mask": np.ones_like(LONG_IDS).tolist()})
    scorer = score_model("qwen2", do_normalize=False)
    export_model(scorer, str(tmp_path / "score"))
    jobs.append({"dir": str(tmp_path / "score"), "kind": "score"})
    export_dir(tiny_model_dir, str(tmp_path / "tiny"))
    texts = ["USER: Reverse: k3x9q ASSISTANT:", "q9x3k! (a+b)", "<|im_start|>user\nHello, world<|im_end|>"]
    # The tiny vocabulary has no "\n": SentencePiece gives <unk>, transformers 5's rebuilt tokenizer drops it.
    sp_texts = [t.replace("\n", " ") for t in texts]
    jobs.append({"dir": str(tmp_path / "tiny"), "kind": "causal", "texts": sp_texts})
    build_real_shape(str(tmp_path / "qwen2_ours"), "qwen2.5-0.5b", num_layers=1, small=True)
    export_dir(str(tmp_path / "qwen2_ours"), str(tmp_path / "qwen2_bpe"))
    jobs.append({"dir": str(tmp_path / "qwen2_bpe"), "kind": "causal", "texts": texts, "fast": True})
    out = run_transformers(jobs, tmp_path)
    for model in scaled.values():
        scaled_out = out.pop(2)
        np.testing.assert_allclose(scaled_out["logits"], causal_logits(model, ids=LONG_IDS), rtol=ROUND_TRIP_RTOL,
                                   atol=TRANSFORMERS_ATOL)
    for name, model in models.items():
        theirs = out[0 if name == "llama" else 1]["logits"] * MASK[..., None]
        np.testing.assert_allclose(theirs, causal_logits(model, mask=MASK),
                                   rtol=ROUND_TRIP_RTOL, atol=TRANSFORMERS_ATOL)
    assert bool(out[1]["tied"]) and str(out[1]["class_name"]) == "Qwen2ForCausalLM"
    bias = float(scorer.score_head.bias.numpy()[0])  # transformers' score layer has no bias
    np.testing.assert_allclose(out[2]["scores"] + bias, end_scores(scorer), rtol=ROUND_TRIP_RTOL, atol=TRANSFORMERS_ATOL)
    from ppo.models.loading import load_tokenizer

    for job, source, job_texts in ((3, tiny_model_dir, sp_texts), (4, str(tmp_path / "qwen2_ours"), texts)):
        ours = [load_tokenizer(source)(t, add_special_tokens=False)["input_ids"] for t in job_texts]
        assert json.loads(str(out[job]["token_ids"])) == ours, source
    qwen2_lm = load_hf_model(str(tmp_path / "qwen2_bpe"))  # GQA 4/2 heads, q/k/v biases, tied, rope theta 1e6
    np.testing.assert_allclose(out[4]["logits"] * MASK[..., None], causal_logits(qwen2_lm, mask=MASK),
                               rtol=ROUND_TRIP_RTOL, atol=TRANSFORMERS_ATOL)


def test_ppo_and_sft_start_from_hugging_face_directories(tmp_path, tiny_model_dir, tiny_rm_dir, tiny_data_dir):
    """The demo's entry points with every model path naming an exported directory: the models load
    with the exported weights (not a random initialisation) and a step trains with finite metrics."""
    from ppo.models.loading import load_causal_lm
    from ppo.models.score_model import AutoModelForScore
    from ppo.run_ppo import build_trainer
    from sft.run_sft import main as run_sft
    from tests.test_ppo_trainer import ppo_argv, read_metrics

    actor, reward = str(tmp_path / "actor_hf"), str(tmp_path / "reward_hf")
    export_dir(tiny_model_dir, actor)
    export_dir(tiny_rm_dir, reward)
    out = str(tmp_path / "ppo")
    trainer = build_trainer(ppo_argv(actor, reward, tiny_data_dir, out, "--max_steps", "1"))
    ids = [[1, 4, 7, 30, 31, 2, 9]]
    np.testing.assert_array_equal(causal_logits(trainer.passes.models.actor, ids), causal_logits(load_causal_lm(tiny_model_dir), ids))
    np.testing.assert_array_equal(trainer.passes.models.reward.score_head.weight.numpy(),
                                  AutoModelForScore.from_pretrained(tiny_rm_dir).score_head.weight.numpy())
    trainer.train()
    (line,) = [r for r in read_metrics(out) if "objective/scores" in r]
    assert all(np.isfinite(line[k]) for k in ("objective/scores", "loss/policy_avg", "loss/value_avg"))
    sft_out = str(tmp_path / "sft")
    run_sft(["config/tiny/sft_argument.json", "--model_name_or_path", actor,
             "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl",
             "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--output_dir", sft_out,
             "--logging_dir", f"{sft_out}/vdl", "--max_steps", "2", "--per_device_train_batch_size", "8",
             "--evaluation_strategy", "no", "--do_eval", "false", "--save_steps", "0", "--disable_tqdm", "true"])
    trained = load_causal_lm(sft_out)  # PaddleNLP's layout, as every run here saves
    assert not is_hf_dir(sft_out)
    assert np.abs(causal_logits(trained, ids) - causal_logits(load_causal_lm(actor), ids)).max() > 0



def test_a_safetensors_file_without_metadata_is_still_recognised_by_its_names(tmp_path):
    from safetensors.numpy import save_file

    model = tiny_model("llama")
    export_model(model, str(tmp_path))
    tensors = hf_files.read_safetensors(str(tmp_path))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp_path / hf_files.SAFE_WEIGHTS))
    assert not hf_files._header(str(tmp_path / hf_files.SAFE_WEIGHTS))[1].get("__metadata__")
    assert is_hf_dir(str(tmp_path))
    from ppo.models.loading import load_causal_lm

    np.testing.assert_array_equal(causal_logits(load_causal_lm(str(tmp_path))), causal_logits(model))
    ours = str(tmp_path / "ours")
    model.save_pretrained(ours, safe_serialization=True)  # PaddleNLP's safetensors: format np, llama. names
    assert not is_hf_dir(ours)
