"""Shared by the chat-template pipeline tests: run SFT, RM, DPO, PPO and GRPO for 2 steps each
through the real entry points on multi-turn chat data (`ppo.tiny.chat_data`) with
`use_chat_template`, and read back what each run wrote."""
import json
import math
import os

import numpy as np
from tests.demo_config_flags import GRPO_AS_BEFORE, PPO_AS_BEFORE

STEPS = 2


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def train_records(out, key):
    """Logged training steps of a run (records carrying `key`), checked finite."""
    records = [r for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if key in r and "step" in r]
    for r in records:
        assert math.isfinite(r[key]), (out, r)
    return records


def common_flags(out, max_length):
    return [
        "--use_chat_template", "true", "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", str(STEPS), "--logging_steps", "1", "--warmup_steps", "0", "--disable_tqdm", "true",
        "--report_to", "none", "--eval_datasets", "", "--save_strategy", "no", "--evaluation_strategy", "no",
        "--max_length", str(max_length),
    ]


def run_sft(model_dir, data, out, max_length, extra=()):
    from sft.run_sft import main

    main(["config/tiny/sft_argument.json", "--model_name_or_path", model_dir,
          "--train_datasets", f"Jsonfile:1.0:{data['sft']}", "--per_device_train_batch_size", "1",
          *common_flags(out, max_length), *extra])
    return train_records(out, "loss/sft")


def run_rm(model_dir, data, out, max_length, extra=()):
    from rm.run_reward import main

    main(["config/tiny/rm_argument.json", "--model_name_or_path", model_dir,
          "--train_datasets", f"json:1.0:{data['preference']}", "--per_device_train_batch_size", "1",
          *common_flags(out, max_length), *extra])
    return train_records(out, "rm/loss")


def run_dpo(model_dir, data, out, max_length, extra=()):
    from dpo.run_dpo import main

    main(["config/tiny/dpo_argument.json", "--model_name_or_path", model_dir,
          "--train_datasets", f"json:1.0:{data['preference']}", "--eval_generation_datasets", "",
          "--per_device_train_batch_size", "1", *common_flags(out, max_length), *extra])
    return train_records(out, "loss/dpo")


def rl_flags(data, out, max_prompt_len, max_dec_len):
    return [
        "--train_datasets", f"Jsonfile:1.0:{data['prompts']}", "--eval_datasets", "",
        "--use_chat_template", "true", "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", str(STEPS), "--max_prompt_len", str(max_prompt_len),
        "--max_length", str(max_prompt_len + max_dec_len), "--max_dec_len", str(max_dec_len), "--min_dec_len", "1",
        "--evaluation_strategy", "no", "--save_steps", "0", "--num_sample_generations", "1", "--disable_tqdm", "true",
        "--update_iters", "1",
    ]


def run_ppo(model_dir, rm_dir, data, out, max_prompt_len, max_dec_len=4, extra=()):
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, "--actor_model_name_or_path", model_dir,
                             "--reward_model_name_or_path", rm_dir, "--per_device_prompt_batch_size", "1",
                             "--per_device_train_batch_size", "1", *rl_flags(data, out, max_prompt_len, max_dec_len),
                             *extra])
    trainer.train()
    return trainer, train_records(out, "objective/scores")


def run_grpo(model_dir, url, data, out, max_prompt_len, max_dec_len=4, extra=()):
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(["config/tiny/grpo_argument.json", *GRPO_AS_BEFORE, "--actor_model_name_or_path", model_dir,
                             "--reward_server", url, "--per_device_prompt_batch_size", "1", "--rollout_n", "2",
                             "--per_device_train_batch_size", "2", "--reward_server_retries", "1",
                             *rl_flags(data, out, max_prompt_len, max_dec_len), *extra])
    trainer.train()
    return trainer, train_records(out, "objective/scores")


def assert_rl_run(records, out, opener, max_dec_len):
    """Two logged steps, finite losses, prompts that end with the template's generation prompt `opener`."""
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert np.isfinite(r["loss/policy_avg"]) and 1 <= r["response_length/mean"] <= max_dec_len
    samples = read_jsonl(os.path.join(out, "samples.jsonl"))
    assert samples
    for s in samples:
        assert s["prompt"].endswith(opener), s["prompt"][-80:]


MOE_KEYS = ("moe/aux_loss", "moe/z_loss", "moe/expert_load_max_over_mean", "moe/dropped_tokens")


def assert_router_stats(records):
    """Every logged step of an MoE run carries finite router stats: a positive load-balancing
    loss, the busiest expert at or above the mean load, no dropped token (no capacity limit)."""
    for r in records:
        for key in MOE_KEYS:
            assert key in r and math.isfinite(r[key]), (key, r)
        assert r["moe/aux_loss"] > 0 and r["moe/expert_load_max_over_mean"] >= 1.0 and r["moe/dropped_tokens"] == 0.0


def saved_shapes(model_dir):
    """`{name: shape}` of the weights saved in `model_dir` (`*.pdparams` or `*.safetensors`)."""
    import glob

    import paddle

    shapes = {}
    for file in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        from safetensors import safe_open

        with safe_open(file, framework="np") as f:
            shapes.update({k: list(f.get_slice(k).get_shape()) for k in f.keys()})
    for file in sorted(glob.glob(os.path.join(model_dir, "*.pdparams"))):
        shapes.update({k: list(v.shape) for k, v in paddle.load(file, return_numpy=True).items()})
    assert shapes, f"no weights in {model_dir}: {sorted(os.listdir(model_dir))}"
    return shapes


def layer_shapes(spec):
    """`{name within a layer: shape}` of a decoder layer of the `REAL_SHAPES` entry `spec`."""
    H, nq, nkv = spec["hidden_size"], spec["num_attention_heads"], spec["num_key_value_heads"]
    hd = spec.get("head_dim") or H // nq
    want = {"self_attn.q_proj.weight": [H, nq * hd], "self_attn.k_proj.weight": [H, nkv * hd],
            "self_attn.v_proj.weight": [H, nkv * hd], "self_attn.o_proj.weight": [nq * hd, H]}
    if spec["model_type"].startswith("qwen3"):
        want.update({"self_attn.q_norm.weight": [hd], "self_attn.k_norm.weight": [hd]})
    if "num_experts" in spec:
        width = spec["moe_intermediate_size"]
        want["mlp.gate.weight"] = [H, spec["num_experts"]]
        for e in range(spec["num_experts"]):
            want.update({f"mlp.experts.{e}.gate_proj.weight": [H, width], f"mlp.experts.{e}.up_proj.weight": [H, width],
                         f"mlp.experts.{e}.down_proj.weight": [width, H]})
    else:
        width = spec["intermediate_size"]
        want.update({"mlp.gate_proj.weight": [H, width], "mlp.up_proj.weight": [H, width], "mlp.down_proj.weight": [width, H]})
    return want


def assert_real_shape_saved(model_dir, spec, num_layers, causal=True):
    """The checkpoint in `model_dir` has `spec`'s shape (`REAL_SHAPES`) on each of `num_layers`
    layers: every attention and MLP (or expert) weight, the expert count (no expert past it), the
    real vocabulary in the embedding and, for a causal LM, the LM head ([V, H] tied, else [H, V])."""
    shapes = saved_shapes(model_dir)
    V, H = spec["vocab_size"], spec["hidden_size"]
    assert [s for k, s in shapes.items() if k.endswith("embed_tokens.weight")] == [[V, H]]
    for i in range(num_layers):
        for name, shape in layer_shapes(spec).items():
            got = [s for k, s in shapes.items() if k.endswith(f"layers.{i}.{name}")]
            assert got == [shape], (model_dir, i, name, got)
    assert not [k for k in shapes if f"layers.{num_layers}." in k]
    if "num_experts" in spec:
        assert not [k for k in shapes if f"experts.{spec['num_experts']}." in k]
    if causal:
        assert shapes["lm_head.weight"] == ([V, H] if spec["tie_word_embeddings"] else [H, V])
    else:
        assert "lm_head.weight" not in shapes


def assert_real_shape_adapter(model_dir, spec, num_layers):
    """The LoRA adapter saved in `model_dir` sits on `spec`'s layers (`REAL_SHAPES`): every adapted
    weight of `layer_shapes` has `lora_A [in, r]` and `lora_B [r, out]` of the real widths, and
    each of the `num_experts` experts of every layer has its adapters (none past them)."""
    assert os.path.isfile(os.path.join(model_dir, "lora_config.json")), sorted(os.listdir(model_dir))
    shapes = saved_shapes(model_dir)
    adapted = 0
    for i in range(num_layers):
        for name, shape in layer_shapes(spec).items():
            base = f"layers.{i}.{name[:-len('.weight')]}"
            a = [s for k, s in shapes.items() if k.endswith(f"{base}.lora_A")]
            b = [s for k, s in shapes.items() if k.endswith(f"{base}.lora_B")]
            if len(shape) == 2 and a:
                assert a[0][0] == shape[0] and b[0][1] == shape[1] and a[0][1] == b[0][0], (base, a, b, shape)
                adapted += 1
        for e in range(spec.get("num_experts", 0)):
            assert [k for k in shapes if f"layers.{i}.mlp.experts.{e}." in k], (i, e)
    assert adapted > 0
    if "num_experts" in spec:
        assert not [k for k in shapes if f"experts.{spec['num_experts']}." in k]
