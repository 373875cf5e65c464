"""LoRA at every stage with one base model directory on disk: LoRA SFT -> LoRA reward model (on
the SFT adapter) -> LoRA PPO (actor and critic adapters; the reference is the SFT model, the
new adapter off) and LoRA GRPO, through the real entry scripts and config/tiny/lora_*.json."""
import json
import os

import numpy as np
import pytest

from tests.pinned_metrics import assert_pinned


PPO_STEPS = 36  # the LoRA PPO run's length; held-out greedy scores are taken at 0 and here
# The LoRA GRPO run from the base model: its metrics at steps 1 and 3 are pinned
# (tests/fixtures/pinned_metrics.json, lora_grpo). Measured spread: repeated runs bit for bit equal;
# 2 threads or MKL's generic code path move them by at most 2.7e-7.
PIN_TOLERANCE = dict(rtol=3e-5, atol=1e-6)


def run_entry(main, config, *overrides):
    main([config, *overrides, "--disable_tqdm", "true"])


def read_metrics(out):
    return [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]


def full_weight_dirs(root):
    """Directories under `root` holding full model weights (not LoRA adapters)."""
    return sorted(d for d, _, files in os.walk(root) if "model_state.pdparams" in files or "model.safetensors" in files)


def write_verbose_pairs(data_dir, root):
    """Preference pairs the fixture-sized model learns in seconds: the right answer against the
    answer written twice (a verbose flaw), from the SFT records; 224 for training, 64 held out."""
    rows = [json.loads(ln) for ln in open(f"{data_dir}/sft.jsonl")]
    pairs = [{"prompt": r["src"][0], "response_0": r["tgt"][0], "response_1": r["tgt"][0] * 2, "better_response_id": 0,
              "safer_response_id": 0, "is_response_0_safe": True, "is_response_1_safe": True} for r in rows]
    files = {"train": pairs[:-64], "eval": pairs[-64:]}
    for name, part in files.items():
        (root / f"pairs_{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in part))
    return {name: str(root / f"pairs_{name}.jsonl") for name in files}


def reference_answer_score(rm_dir, data_dir, template="USER: {input} ASSISTANT:"):
    """The reward model's mean score of test.jsonl's right answers, tokenised as PPO's held-out
    evaluation scores a greedy answer (the prompt with BOS, the answer, EOS)."""
    import paddle

    from ppo.models.adapters import load_merged_score_model
    from ppo.models.loading import load_tokenizer

    tokenizer, model = load_tokenizer(rm_dir), load_merged_score_model(rm_dir)
    model.eval()
    scores = []
    for row in map(json.loads, open(f"{data_dir}/test.jsonl")):
        ids = tokenizer(template.format(input=row["src"][0]))["input_ids"]
        ids += tokenizer(row["tgt"][0], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        with paddle.no_grad():
            x = paddle.to_tensor([ids])
            scores.append(float(model(input_ids=x, attention_mask=paddle.ones_like(x)).end_scores.numpy().ravel()[0]))
    return sum(scores) / len(scores)


@pytest.fixture(scope="module")
def lora_runs(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """The whole LoRA flow on the fixtures' tiny model; returns the output directories."""
    from ppo.run_ppo import main as run_ppo
    from rm.run_reward import main as run_reward
    from sft.run_sft import main as run_sft

    root = tmp_path_factory.mktemp("lora_flow")
    pairs = write_verbose_pairs(tiny_data_dir, tmp_path_factory.mktemp("pairs"))
    out = {name: str(root / name) for name in ("sft", "rm", "ppo", "grpo")}
    # The fixture-sized flow is chaotic: a change of environment moves where the SFT adapter lands (the commit that
    # picked seed 2 for +1.8 gives 2.15 -> 2.08 in a later virtual environment, and this file's seed 2 3.088 -> 3.088).
    # The reward model learns answer length (a right answer against it written twice); some seeds' SFT adapters
    # already answer at that length: seeds 1, 2, 7 and 42 there score at or above the right answers and PPO has
    # nothing to raise. Seed 3 starts 2.4 below the right answers; 36 PPO steps take its greedy held-out score
    # 0.62 -> 0.81 (12) -> 1.71 (24) -> 2.78 (36). test_lora_ppo_raises_the_learned_reward checks the headroom first.
    common = ["--lora_rank", "8", "--lora_alpha", "16", "--evaluation_strategy", "no", "--seed", "3"]
    run_entry(run_sft, "config/tiny/lora_sft_argument.json", "--model_name_or_path", tiny_model_dir,
              "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl", "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl",
              "--output_dir", out["sft"], "--logging_dir", f"{out['sft']}/vdl", "--max_steps", "150", "--warmup_steps", "10",
              "--per_device_train_batch_size", "32", "--learning_rate", "1e-2", "--logging_steps", "10", "--save_steps", "150", *common)
    run_entry(run_reward, "config/tiny/lora_rm_argument.json", "--model_name_or_path", out["sft"],
              "--train_datasets", f"PKU-SafeRLHF/train:1.0:{pairs['train']}", "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{pairs['eval']}",
              "--output_dir", out["rm"], "--logging_dir", f"{out['rm']}/vdl", "--max_steps", "60", "--warmup_steps", "5",
              "--per_device_train_batch_size", "32", "--learning_rate", "5e-3", "--logging_steps", "10", "--save_steps", "60",
              "--loss_type", "sequence-wise", *common)
    prompts = ["--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl", "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl"]
    run_entry(run_ppo, "config/tiny/lora_ppo_argument.json", "--actor_model_name_or_path", out["sft"],
              "--reward_model_name_or_path", out["rm"], *prompts, "--output_dir", out["ppo"], "--logging_dir", f"{out['ppo']}/vdl",
              "--max_steps", str(PPO_STEPS), "--per_device_prompt_batch_size", "16", "--per_device_train_batch_size", "16",
              "--learning_rate", "2e-3", "--max_dec_len", "8", "--save_steps", str(PPO_STEPS), "--num_sample_generations", "0", *common,
              "--evaluation_strategy", "steps", "--eval_steps", str(PPO_STEPS))  # greedy held-out scores at 0 and PPO_STEPS
    run_entry(run_ppo, "config/tiny/lora_grpo_argument.json", "--actor_model_name_or_path", out["sft"], *prompts,
              "--use_rm_server", "false", "--use_rule_reward", "true", "--rule_reward_scorers", "reverse",
              "--output_dir", out["grpo"], "--logging_dir", f"{out['grpo']}/vdl", "--max_steps", "3",
              "--per_device_prompt_batch_size", "4", "--rollout_n", "4", "--per_device_train_batch_size", "16",
              "--max_dec_len", "8", "--save_steps", "3", "--num_sample_generations", "0", *common)
    return {"root": str(root), "data": tiny_data_dir, **out}


def test_one_base_model_directory_on_disk(lora_runs, tiny_model_dir):
    from ppo.models.adapters import adapter_chain

    assert full_weight_dirs(lora_runs["root"]) == []  # every stage wrote an adapter
    assert adapter_chain(lora_runs["rm"]) == (tiny_model_dir, [lora_runs["sft"], lora_runs["rm"]])
    assert adapter_chain(os.path.join(lora_runs["ppo"], "policy")) == (tiny_model_dir, [lora_runs["sft"], os.path.join(lora_runs["ppo"], "policy")])
    value = os.path.join(lora_runs["ppo"], "value")
    assert adapter_chain(value) == (tiny_model_dir, [lora_runs["sft"], lora_runs["rm"], value])
    assert adapter_chain(os.path.join(lora_runs["grpo"], "policy"))[1][0] == lora_runs["sft"]


def test_reward_adapter_ranks_held_out_pairs(lora_runs):
    summary = json.load(open(os.path.join(lora_runs["rm"], "summary.json")))
    assert summary["final_eval"]["rm/accuracy"] >= 0.75, summary["final_eval"]


def test_lora_ppo_raises_the_learned_reward(lora_runs):
    from ppo.models.adapters import load_merged_score_model
    from ppo.models.loading import load_causal_lm, load_tokenizer

    rows = read_metrics(lora_runs["ppo"])
    assert len([r for r in rows if "objective/scores" in r]) == PPO_STEPS
    held_out = {r["step"]: r["eval/score"] for r in rows if "eval/score" in r}  # the reward model's greedy mean score
    assert sorted(held_out) == [0, PPO_STEPS], held_out
    # precondition: the SFT adapter's greedy answers score well under the right answers (3x the gain asked), else
    # the fixture, not PPO, is what failed
    right = reference_answer_score(lora_runs["rm"], lora_runs["data"])
    assert held_out[0] < right - 1.5, f"fixture without headroom: SFT greedy {held_out[0]:.3f}, right answers {right:.3f}"
    assert held_out[PPO_STEPS] > held_out[0] + 0.5, (held_out, right)
    policy = load_causal_lm(os.path.join(lora_runs["ppo"], "policy"))  # the saved adapter chain reloads
    critic = load_merged_score_model(os.path.join(lora_runs["ppo"], "value"))
    assert critic.config.score_type == "critic" and load_tokenizer(os.path.join(lora_runs["ppo"], "policy")).pad_token_id is not None
    assert type(policy).__name__ == "LoRAModel"


def test_lora_grpo_runs_with_the_adapter_off_reference(lora_runs):
    lines = [r for r in read_metrics(lora_runs["grpo"]) if "objective/scores" in r]
    assert len(lines) == 3 and all(0.0 <= r["objective/scores"] <= 1.0 and np.isfinite(r["objective/kl"]) for r in lines)
    assert lines[0]["objective/kl"] == pytest.approx(0.0, abs=1e-6)  # first rollout: the actor equals its reference
    assert os.path.isfile(os.path.join(lora_runs["grpo"], "policy", "lora_model_state.pdparams"))


def test_lora_grpo_from_the_base_model_trains_at_recorded_values(tiny_model_dir, tiny_data_dir, tmp_path):
    """LoRA GRPO from a model without an adapter, through the real entry script and
    config/tiny/lora_grpo_argument.json: a fresh adapter on the actor, the reference is the same
    model with the adapter off, a k3 KL loss against it, and graded rule rewards (groups differ, so
    advantages are not 0). At step 1 the actor is its reference (KL 0); by step 3 it has moved away
    from it (a reference that followed the adapter would keep the KL at 0); the base weights on disk
    stay as they were; the metrics at steps 1 and 3 are the recorded ones (`PIN_TOLERANCE`). (The flow's
    LoRA GRPO above starts from the SFT adapter, whose 150 steps carry a change of thread count or
    BLAS code path into visibly different answers, so its numbers are not pinned.)"""
    import tests.rule_reward_helpers  # noqa: F401  (registers the test scorers)
    from ppo.run_ppo import main as run_ppo

    out = str(tmp_path / "lora_grpo")
    run_entry(run_ppo, "config/tiny/lora_grpo_argument.json", "--actor_model_name_or_path", tiny_model_dir,
              "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl", "--eval_datasets", "",
              "--use_rm_server", "false", "--use_rule_reward", "true",
              "--rule_reward_scorers", "tests.rule_reward_helpers:_char_recall_scorer", "--kl_loss_coeff", "0.05",
              "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "3", "--per_device_prompt_batch_size", "4",
              "--rollout_n", "4", "--per_device_train_batch_size", "16", "--max_dec_len", "6", "--learning_rate", "1e-2",
              "--lora_rank", "8", "--lora_alpha", "16", "--evaluation_strategy", "no", "--save_steps", "3",
              "--num_sample_generations", "0", "--seed", "3")
    rows = read_metrics(out)
    lines = [r for r in rows if "objective/scores" in r]
    assert [r["step"] for r in lines] == [1, 2, 3] and all(r["objective/scores"] > 0 for r in lines)
    # the rollout's KL to the reference: 0 before the first update, then positive
    assert lines[0]["objective/kl"] == pytest.approx(0.0, abs=1e-6) and lines[-1]["objective/kl"] > 1e-3
    assert lines[-1]["loss/kl"] > 1e-3
    assert full_weight_dirs(out) == [] and os.path.isfile(os.path.join(out, "policy", "lora_model_state.pdparams"))
    assert_pinned("lora_grpo", rows, **PIN_TOLERANCE)
