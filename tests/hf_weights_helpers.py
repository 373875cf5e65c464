"""Tiny Llama / Qwen2 causal LMs and score models with random weights for tests/test_hf_weights.py,
their outputs on a fixed left-padded batch, and the transformers side run in another process."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import paddle

PAD = 0  # PaddleNLP's default pad_token_id for both configs; real tokens below avoid it
IDS = np.array([[PAD, PAD, 5, 17, 42, 8, 33, 21], [7, 3, 49, 12, 26, 31, 2, 44]], dtype="int64")
LONG_IDS = np.arange(1, 41, dtype="int64")[None] % 49 + 1  # 40 positions: past llama3's original 16
MASK = (IDS != PAD).astype("int64")
SIZES = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def config_of(kind, tied=False, **overrides):
    from paddlenlp.transformers import LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[kind]
    config = cls(**{**SIZES, **overrides}, tie_word_embeddings=tied, rms_norm_eps=1e-5, rope_theta=5000.0,
                 pad_token_id=PAD, bos_token_id=1, eos_token_id=2, dtype="float32")
    if kind == "qwen2":
        config.use_sliding_window = False
    return config


def randomize(model, seed):
    """Every weight random (norms around 1, the rest N(0, 0.2)), so no mapping error hides behind
    an initial value such as a norm of ones or a zero bias."""
    paddle.seed(seed)
    with paddle.no_grad():
        for name, param in model.named_parameters():
            noise = paddle.randn(param.shape, dtype="float32")
            param.set_value((1.0 + 0.1 * noise if "norm" in name else 0.2 * noise).astype(param.dtype))
    model.eval()
    return model


ROPE = {
    "linear": {"rope_scaling_type": "linear", "rope_scaling_factor": 2.0},
    "llama3": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 16}},
}
"""Rotary scalings PaddleNLP's Llama implements, as its config fields."""


def tiny_model(kind, fused=False, tied=False, dtype="float32", seed=0, rope=None, **overrides):
    """A PaddleNLP causal LM with random weights; `fused`: PaddleNLP's fused q/k/v and gate/up
    layers; `rope`: a rotary scaling of `ROPE`."""
    from paddlenlp.transformers import LlamaForCausalLM, Qwen2ForCausalLM

    config = config_of(kind, tied=tied, **overrides)
    config.fuse_attention_qkv = fused  # (the constructors drop these keywords in paddlenlp 3.0.0b4)
    config.fuse_attention_ffn = fused
    for key, value in ROPE.get(rope, {}).items():
        setattr(config, key, value)
    model = randomize({"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}[kind](config), seed)
    if dtype != "float32":
        model.to(dtype=dtype)
        model.config.dtype = dtype
    return model


def score_model(kind, seed=1, score_bias=True, **settings):
    """Our score model with random weights and normaliser statistics mean 0.75, var 4, count 10."""
    from ppo.models.score_model import SCORE_CONFIG_DEFAULTS, score_model_class

    sizes = {k: settings.pop(k) for k in list(settings) if k in SIZES}
    config = config_of(kind, **sizes)
    for key, value in {**SCORE_CONFIG_DEFAULTS, "score_bias": score_bias, **settings}.items():
        setattr(config, key, value)
    model = randomize(score_model_class(kind)(config), seed)
    for key, value in (("mean", 0.75), ("var", 4.0), ("count", 10.0)):
        getattr(model, f"normalizer_{key}").set_value(paddle.to_tensor([value], dtype="float32"))
    return model


def family_score_model(model_type, config, seed=1):
    """Our score model of `model_type` on the backbone `config`, random, normaliser off (as
    transformers' `*ForSequenceClassification`, which applies none)."""
    from ppo.models.score_model import SCORE_CONFIG_DEFAULTS, score_model_class

    for key, value in {**SCORE_CONFIG_DEFAULTS, "do_normalize": False}.items():
        setattr(config, key, value)
    return randomize(score_model_class(model_type)(config), seed)


def causal_logits(model, ids=IDS, mask=None):
    """float32 logits [B, T, V]; with `mask`, positions outside it are zeroed (padding queries
    attend to nothing, which libraries fill differently)."""
    model.eval()
    with paddle.no_grad():
        kwargs = {} if mask is None else {"attention_mask": paddle.to_tensor(mask)}
        out = model(input_ids=paddle.to_tensor(ids), return_dict=True, **kwargs)
    logits = out.logits.astype("float32").numpy()
    return logits if mask is None else logits * np.asarray(mask)[..., None]


def end_scores(model, ids=IDS, mask=MASK, normalized=True):
    """Scores [B] at each row's last real token (raw, before the normaliser, when not `normalized`)."""
    model.eval()
    keep = model.config.do_normalize
    model.config.do_normalize = keep and normalized
    try:
        with paddle.no_grad():
            return model(paddle.to_tensor(ids), attention_mask=paddle.to_tensor(mask)).end_scores.numpy()
    finally:
        model.config.do_normalize = keep


def hf_python():
    """A Python with torch and transformers: $PADDLE_ALIGN_HF_PYTHON, else this one if it has both, else None."""
    named = os.environ.get("PADDLE_ALIGN_HF_PYTHON")
    if named:
        return named
    has = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
    return sys.executable if has else None


def run_transformers(jobs, tmp_path):
    """Run tests/hf_transformers_check.py on `jobs` (IDS / MASK filled in); returns one dict per job."""
    for i, job in enumerate(jobs):
        job.setdefault("input_ids", IDS.tolist())
        job.setdefault("attention_mask", MASK.tolist())
        job["out"] = str(tmp_path / f"transformers_{i}.npz")
    job_file = tmp_path / "transformers_jobs.json"
    job_file.write_text(json.dumps(jobs))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_transformers_check.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([hf_python(), script, str(job_file)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [dict(np.load(job["out"])) for job in jobs]


def transformers_round_trip(ours, built, tmp_path, legacy_suffix="v4", scorer=None):
    """Export each of our models `ours` ({name: causal LM}) and build each transformers config of
    `built` ({name: config dict with model_type}; a name ending in `legacy_suffix` is rewritten in
    transformers 4's rope layout) in transformers, run both sides on IDS / MASK. Returns
    ``(out, diffs)``: the transformers outputs (one per job, ours first) and {name: max |logit
    difference| at real tokens}, ours against transformers' load of our export, then transformers'
    model against our import of it (`ppo.models.hf_import.load_hf_model`, kept in ``out[i]["ours"]``).
    `scorer`: a score model of ours (``do_normalize`` off), exported and run as transformers'
    ``*ForSequenceClassification`` last; ``diffs["score"]`` compares the scores (its head bias,
    which transformers' has not, added back)."""
    from ppo.models.hf_convert import export_model
    from ppo.models.hf_import import load_hf_model

    jobs = []
    for name, model in ours.items():
        export_model(model, str(tmp_path / name))
        jobs.append({"dir": str(tmp_path / name), "kind": "causal"})
    for name, config in built.items():
        jobs.append({"dir": str(tmp_path / name), "kind": "build", "config": config, "seed": len(jobs),
                     "legacy_rope": name.endswith(legacy_suffix)})
    if scorer is not None:
        export_model(scorer, str(tmp_path / "score"))
        jobs.append({"dir": str(tmp_path / "score"), "kind": "score"})
    out = run_transformers(jobs, tmp_path)
    diffs = {}
    if scorer is not None:
        bias = float(scorer.score_head.bias.numpy()[0])
        diffs["score"] = float(np.abs(out[-1]["scores"] + bias - end_scores(scorer)).max())
    for i, (name, model) in enumerate(list(ours.items()) + [(n, None) for n in built]):
        if model is None:
            model = out[i]["ours"] = load_hf_model(str(tmp_path / name))
        diffs[name] = float(np.abs(out[i]["logits"] * MASK[..., None] - causal_logits(model, mask=MASK)).max())
    return out, diffs
