"""Shared by tests/test_family_stages.py: each training stage run for 2 steps through its real
entry point on the tiny model of one family (`ppo.tiny.factory --arch ...`), returning what the
test asserts on (the logged steps, the trained model in memory, the output directory)."""
import json
import os

import numpy as np

from tests.hf_weights_helpers import causal_logits, end_scores

FAMILIES = ("qwen3", "qwen3_moe", "ernie45", "ernie45_moe", "qwen2_moe", "mixtral")
MOE = {"qwen3_moe", "ernie45_moe", "qwen2_moe", "mixtral"}
CAUSAL = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "ernie45": "Ernie4_5ForCausalLM",
          "ernie45_moe": "Ernie4_5_MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "mixtral": "MixtralForCausalLM"}
SCORE = {arch: name.replace("ForCausalLM", "ModelForScore") for arch, name in CAUSAL.items()}
STEPS = 2
IDS = [[1, 4, 7, 30, 31, 2, 9]]
MOE_KEYS = ("moe/aux_loss", "moe/expert_load_max_over_mean", "moe/dropped_tokens")
COMMON = ["--max_steps", str(STEPS), "--logging_steps", "1", "--disable_tqdm", "true", "--report_to", "none"]


def read_steps(out, key):
    """The logged training steps of a run (records carrying `key`), checked: one per step, finite."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [r for r in map(json.loads, f) if key in r and "step" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), (out, key, records)
    for r in records:
        assert np.isfinite(r[key]), (key, r)
    return records


def summary(out):
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def assert_finite(records, *keys):
    for r in records:
        for key in keys:
            assert key in r and np.isfinite(r[key]), (key, r)


def assert_router_stats(arch, records):
    """An MoE family logs the router's aux loss and load per step; no token is dropped."""
    if arch in MOE:
        assert_finite(records, *MOE_KEYS)
        assert all(r["moe/dropped_tokens"] == 0.0 and r["moe/expert_load_max_over_mean"] >= 1.0 for r in records)


def capture_trainer(monkeypatch, module):
    """Patch `module.finish_trainer_run` to keep the trainer it finishes (`seen["trainer"]`)."""
    seen, real = {}, module.finish_trainer_run

    def finish(trainer, args, tokenizer):
        seen["trainer"] = trainer
        return real(trainer, args, tokenizer)

    monkeypatch.setattr(module, "finish_trainer_run", finish)
    return seen


def shapes(model):
    return {name: tuple(value.shape) for name, value in model.state_dict().items()}


def assert_causal_reload(path, trained, base_dir, arch, adapter=False):
    """The causal LM saved in `path` reloads (`load_causal_lm`, i.e. our family class's
    `from_pretrained`) as the family's class, with the base model's keys and shapes (`adapter`: a
    LoRA adapter on the base model) and the trained model's logits; the training moved them off
    the base model's."""
    from ppo.models.loading import load_causal_lm, unwrap_model

    saved, base = load_causal_lm(path), load_causal_lm(base_dir)
    assert type(unwrap_model(saved)).__name__ == CAUSAL[arch]
    if adapter:
        base_keys = {k.split(".", 1)[1]: v for k, v in shapes(saved).items() if "lora_" not in k}
        assert base_keys == shapes(base)
    else:
        assert shapes(saved) == shapes(base)
    np.testing.assert_array_equal(causal_logits(saved, IDS), causal_logits(unwrap_model(trained), IDS))
    assert np.abs(causal_logits(saved, IDS) - causal_logits(base, IDS)).max() > 0
    return saved


def sft_lora(model_dir, data_dir, out, monkeypatch):
    import sft.run_sft as run_sft

    seen = capture_trainer(monkeypatch, run_sft)
    run_sft.main(["config/tiny/sft_argument.json", "--model_name_or_path", model_dir, "--use_lora", "true",
                  "--lora_rank", "4", "--learning_rate", "1e-2", "--train_datasets", f"Jsonfile:1.0:{data_dir}/sft.jsonl",
                  "--eval_datasets", "", "--output_dir", out, "--logging_dir", f"{out}/vdl",
                  "--per_device_train_batch_size", "8", "--evaluation_strategy", "no", "--do_eval", "false",
                  "--save_steps", "0", "--eval_with_do_generation", "false", *COMMON])
    return read_steps(out, "loss/sft"), seen["trainer"].model


def reward_model(model_dir, data_dir, out, monkeypatch):
    import rm.run_reward as run_reward

    seen = capture_trainer(monkeypatch, run_reward)
    run_reward.main(["config/tiny/rm_argument.json", "--model_name_or_path", model_dir,
                     "--train_datasets", f"PKU-SafeRLHF/train:1.0:{data_dir}/preference.jsonl",
                     "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{data_dir}/preference_eval.jsonl",
                     "--output_dir", out, "--logging_dir", f"{out}/vdl", "--per_device_train_batch_size", "8",
                     "--evaluation_strategy", "no", "--save_steps", "0", "--warmup_steps", "0", *COMMON])
    return read_steps(out, "rm/loss"), seen["trainer"].model


def assert_score_reload(path, trained, base_dir, arch, score_type="reward"):
    """The score model saved in `path` reloads as the family's score class with the causal LM's
    backbone keys and shapes, a `[H, 1]` head, and the trained model's scores."""
    from ppo.models.loading import load_causal_lm, unwrap_model
    from ppo.models.score_model import AutoModelForScore

    saved = AutoModelForScore.from_pretrained(path)
    assert type(saved).__name__ == SCORE[arch] and saved.config.score_type == score_type
    hidden = saved.config.hidden_size
    head = {k: v for k, v in shapes(saved).items() if k.startswith(("score_head.", "normalizer_"))}
    assert head == {"score_head.weight": (hidden, 1), "score_head.bias": (1,), "normalizer_mean": (1,),
                    "normalizer_var": (1,), "normalizer_count": (1,)}, head
    backbone = {k.split(".", 1)[1]: v for k, v in shapes(load_causal_lm(base_dir)).items() if not k.startswith("lm_head")}
    assert {k.split(".", 1)[1]: v for k, v in shapes(saved).items() if k not in head} == backbone
    trained = unwrap_model(trained)
    if score_type == "reward":
        np.testing.assert_array_equal(end_scores(saved), end_scores(trained))
    np.testing.assert_array_equal(saved.score_head.weight.numpy(), trained.score_head.weight.numpy())
    return saved


def dpo(model_dir, data_dir, out, monkeypatch, loss_type):
    import dpo.run_dpo as run_dpo

    seen = capture_trainer(monkeypatch, run_dpo)
    run_dpo.main(["config/tiny/dpo_argument.json", "--model_name_or_path", model_dir, "--loss_type", loss_type,
                  "--train_datasets", f"PKU-SafeRLHF/train:1.0:{data_dir}/preference.jsonl",
                  "--eval_datasets", "", "--eval_generation_datasets", "", "--output_dir", out,
                  "--logging_dir", f"{out}/vdl", "--per_device_train_batch_size", "8", "--learning_rate", "1e-2",
                  "--warmup_steps", "0", "--evaluation_strategy", "no", "--do_eval", "false", *COMMON,
                  *(["--sft_loss_ratio", "0"] if loss_type == "orpo" else [])])  # ORPO's loss holds the NLL
    return read_steps(out, "loss/total"), seen["trainer"]


def rl_argv(config, model_dir, data_dir, out, *extra):
    """GRPO-shaped flags of a 2-step run: 4 prompts x 4 answers of up to 6 tokens."""
    return [config, "--actor_model_name_or_path", model_dir, "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
            "--eval_datasets", "", "--output_dir", out, "--logging_dir", f"{out}/vdl",
            "--per_device_prompt_batch_size", "4", "--rollout_n", "4", "--per_device_train_batch_size", "16",
            "--max_dec_len", "6", "--evaluation_strategy", "no", "--save_steps", "0", "--num_sample_generations", "1",
            "--learning_rate", "1e-3", *COMMON, *extra]


def grpo_server(model_dir, data_dir, out, url):
    from ppo.run_ppo import build_trainer
    from tests.demo_config_flags import GRPO_AS_BEFORE

    trainer = build_trainer(rl_argv("config/tiny/grpo_argument.json", model_dir, data_dir, out, *GRPO_AS_BEFORE,
                                    "--reward_server", url, "--reward_server_retries", "1", "--kl_loss_coeff", "0.01"))
    trainer.train()
    return read_steps(out, "objective/scores"), trainer


def ppo(model_dir, rm_dir, data_dir, out):
    from ppo.run_ppo import build_trainer
    from tests.test_ppo_trainer import ppo_argv

    trainer = build_trainer(ppo_argv(model_dir, rm_dir, data_dir, out, "--eval_datasets", "", "--report_to", "none"))
    trainer.train()
    return read_steps(out, "objective/scores"), trainer


def online_dpo(model_dir, data_dir, out):
    from dpo.run_online_dpo import build_trainer

    trainer = build_trainer(rl_argv("config/tiny/online_dpo_argument.json", model_dir, data_dir, out,
                                    "--rule_reward_scorers", "tests.rule_reward_helpers:_char_recall_scorer",
                                    "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
                                    "--use_fused_adamw", "false"))
    trainer.train()
    return read_steps(out, "loss/dpo"), trainer


def agent_grpo(model_dir, data_dir, out):
    from ppo.run_ppo import build_trainer
    from tests.test_agent_training import grpo_agent_argv

    trainer = build_trainer(grpo_agent_argv(model_dir, data_dir, out, "--max_steps", str(STEPS), "--logging_steps", "1",
                                            "--report_to", "none"))
    trainer.train()
    return read_steps(out, "objective/scores"), trainer


def distill(student_dir, teacher_dir, data_dir, out, monkeypatch):
    import sft.run_distill as run_distill
    from tests.test_distill import distill_argv

    seen = capture_trainer(monkeypatch, run_distill)
    run_distill.main(distill_argv(student_dir, teacher_dir, data_dir, out, "--lmbda", "0.5", "--eval_datasets", "",
                                  "--per_device_train_batch_size", "8", "--save_steps", "0", "--evaluation_strategy", "no",
                                  "--do_eval", "false", *COMMON))
    return read_steps(out, "loss/distill"), seen["trainer"].model


def lora_grpo(model_dir, data_dir, out):
    """GRPO with a LoRA policy (rule scorer), the old log-probs from the training forward so that
    `rollout/logprob_diff_*` compare the engine's (adapter deltas applied) with it."""
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(rl_argv("config/tiny/grpo_rule_argument.json", model_dir, data_dir, out,
                                    "--rule_reward_scorers", "tests.rule_reward_helpers:_char_recall_scorer",
                                    "--use_lora", "true", "--lora_rank", "4", "--learning_rate", "5e-2",
                                    "--use_rollout_logprobs", "false"))
    trainer.train()
    return read_steps(out, "objective/scores"), trainer
