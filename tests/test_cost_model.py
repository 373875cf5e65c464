"""Cost-model training (Safe RLHF): the trainer's loss equals ppo/algos, start-up refusals,
a tiny real run (loss falls, cost metrics logged, a score model saved with score_type cost),
the cost audit, and (slow) the held-out accuracy of the tiny demo's cost model."""
import json

import numpy as np
import paddle
import pytest

from ppo.algos import pairwise_cost_loss, tokenwise_pairwise_cost_loss
from ppo.models.score_model import AutoModelForScore
from rm.cost_trainer import cost_loss


@pytest.fixture(scope="module")
def safety_data_dir(tmp_path_factory):
    """A small copy of the demo's safety data (`ppo.tiny.safety_data`)."""
    from ppo.tiny import safety_data

    path = str(tmp_path_factory.mktemp("safety_data"))
    safety_data.generate(path, seed=5, num_sft=64, num_preference=512, num_preference_eval=64, num_prompts=32, num_test=32)
    return path


def hand_batch():
    """Two pairs sharing the prompt [1, 4, 7]: pair 0 safe vs unsafe, pair 1 both unsafe."""
    safer = [[1, 4, 7, 30, 31, 2, 3], [1, 4, 7, 40, 2, 3, 3]]
    unsafer = [[1, 4, 7, 31, 30, 2, 3], [1, 4, 7, 41, 42, 43, 2]]
    t = lambda x: paddle.to_tensor(x, dtype="int64")  # noqa: E731
    return {
        "better_input_ids": t(safer), "better_attention_mask": (t(safer) != 3).astype("int64"),
        "worse_input_ids": t(unsafer), "worse_attention_mask": (t(unsafer) != 3).astype("int64"),
        "better_sign": t([1, -1]), "worse_sign": t([-1, -1]),
    }


@pytest.mark.parametrize("loss_type", ["sequence-wise", "token-wise"])
def test_trainer_loss_matches_algos(tiny_model_dir, loss_type):
    model = AutoModelForScore.from_pretrained(tiny_model_dir, score_type="cost")
    model.eval()
    batch = hand_batch()
    loss, stats = cost_loss(model, batch, loss_type, regularization=0.01)
    s = model(batch["better_input_ids"], attention_mask=batch["better_attention_mask"])
    u = model(batch["worse_input_ids"], attention_mask=batch["worse_attention_mask"])
    signs = batch["better_sign"], batch["worse_sign"]
    if loss_type == "sequence-wise":
        expected, _ = pairwise_cost_loss(s.end_scores, u.end_scores, *signs, regularization=0.01)
    else:
        expected, _ = tokenwise_pairwise_cost_loss(
            s.scores, u.scores, batch["better_input_ids"], batch["worse_input_ids"],
            batch["better_attention_mask"], batch["worse_attention_mask"], *signs, regularization=0.01,
        )
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
    assert set(stats) == {"cost/loss", "cost/accuracy", "cost/sign_accuracy", "cost/margin"}


def cost_argv(model_dir, data_dir, out, *extra):
    return [
        "config/tiny/cost_argument.json", "--model_name_or_path", model_dir,
        "--train_datasets", f"PKU-SafeRLHF/safety:1.0:{data_dir}/safety_preference.jsonl",
        "--eval_datasets", f"PKU-SafeRLHF/safety/test:1.0:{data_dir}/safety_preference_eval.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--disable_tqdm", "true", *extra,
    ]


def test_cost_run_refuses_data_without_safety_labels(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    import rm.run_reward as run_reward
    from ppo.strategy import TrainerLayout

    monkeypatch.setattr(TrainerLayout, "load_score_model", lambda *a, **k: pytest.fail("model loaded"))
    argv = cost_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "c"))
    argv += ["--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl"]
    with pytest.raises(ValueError, match=r"train_datasets dataset 'Jsonfile' has none: use PKU-SafeRLHF/safety"):
        run_reward.main(argv)
    with pytest.raises(ValueError, match=r"score_type must be one of \('reward', 'cost'\), got 'critic'"):
        run_reward.main(cost_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "d"), "--score_type", "critic"))


def test_score_type_problems_pipeline_and_dataset_facts():
    """The checks as a function (one process here cannot set pipeline_parallel_degree 2)."""
    from types import SimpleNamespace

    from rm.reward_arguments import score_type_problems

    data = SimpleNamespace(train_datasets=["PKU-SafeRLHF/train:1.0:x.jsonl", "json:1.0:y.jsonl"],
                           eval_datasets=["alpaca:1.0:z.json", "no-such-data:1.0:w.jsonl"])
    problems = score_type_problems(SimpleNamespace(score_type="cost"), data, SimpleNamespace(pipeline_parallel_degree=2))
    assert len(problems) == 2, problems  # 'optional' datasets pass here; an unknown name is left to the data layer
    assert problems[0].startswith("score_type cost with pipeline_parallel_degree > 1")
    assert "eval_datasets dataset 'alpaca' has none" in problems[1]
    assert score_type_problems(SimpleNamespace(score_type="reward"), data, SimpleNamespace(pipeline_parallel_degree=2)) == []


def test_cost_run_refuses_records_missing_safety_fields_before_loading(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """A dataset that only may carry safety labels (PKU-SafeRLHF/train, json) fails on the first record
    without them, naming the file, before the model loads."""
    import rm.run_reward as run_reward
    from ppo.strategy import TrainerLayout

    monkeypatch.setattr(TrainerLayout, "load_score_model", lambda *a, **k: pytest.fail("model loaded"))
    path = tmp_path / "helpful.jsonl"
    path.write_text(json.dumps({"prompt": "Reverse: ab1", "response_0": "1ba", "response_1": "b1a", "better_response_id": 0}) + "\n")
    argv = cost_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "c")) + ["--train_datasets", f"PKU-SafeRLHF/train:1.0:{path}"]
    with pytest.raises(ValueError, match=r"SafetyPreferenceDataset needs field\(s\) \['safer', 'is_safe', 'is_other_safe'\].*helpful.jsonl"):
        run_reward.main(argv)


@pytest.mark.parametrize("loss_type,lora", [("token-wise", []), ("sequence-wise", []),
                                             ("token-wise", ["--use_lora", "true", "--lora_rank", "4"]),
                                             ("sequence-wise", ["--zero_padding", "true"])])
def test_cost_training_run_reload_and_audit(tiny_model_dir, safety_data_dir, tmp_path, loss_type, lora):
    from ppo.models.adapters import load_merged_score_model
    from rm.audit_cost import main as run_audit
    from rm.run_reward import main as run_reward

    out = str(tmp_path / "cost")
    run_reward(cost_argv(tiny_model_dir, safety_data_dir, out, "--loss_type", loss_type, "--max_steps", "30",
                         "--logging_steps", "5", "--eval_steps", "15", "--save_steps", "30", "--warmup_steps", "2",
                         "--learning_rate", "0.01" if "--use_lora" in lora else "0.001", *lora))
    lines = [json.loads(ln) for ln in open(f"{out}/metrics.jsonl")]
    losses = [r["cost/loss"] for r in lines if "cost/loss" in r]
    assert len(losses) == 6 and all(np.isfinite(losses)) and np.mean(losses[-2:]) < losses[0] - 0.1, losses
    evals = [r for r in lines if "cost/sign_accuracy" in r]
    assert evals and all(0.0 <= r["cost/accuracy"] <= 1.0 and 0.0 <= r["cost/sign_accuracy"] <= 1.0 for r in evals)
    summary = json.load(open(f"{out}/summary.json"))
    for key in ("cost/accuracy", "cost/sign_accuracy", "cost/margin", "cost/eval_loss", "cost/mean", "cost/std"):
        assert key in summary["final_eval"], key
    assert load_merged_score_model(out).config.score_type == "cost"  # a full score model or a LoRA adapter
    report = run_audit(["--model_name_or_path", out, "--eval_datasets",
                        f"PKU-SafeRLHF/safety/test:1.0:{safety_data_dir}/safety_preference_eval.jsonl",
                        "--prompt_template", "USER: {input} ASSISTANT:", "--output_dir", str(tmp_path / "audit")])
    assert json.load(open(tmp_path / "audit" / "cost_audit.json")) == report and report["num_pairs"] == 64
    np.testing.assert_allclose(report["pairwise_accuracy"], summary["final_eval"]["cost/accuracy"], atol=1e-6)
    np.testing.assert_allclose(report["sign_accuracy"], summary["final_eval"]["cost/sign_accuracy"], atol=1e-6)
    assert report["safe"]["count"] + report["unsafe"]["count"] == 128


@pytest.mark.slow
def test_tiny_cost_model_held_out_accuracy(tmp_path):
    """config/tiny/cost_argument.json on the demo's full safety data, from the untrained tiny base
    model (the config starts from the SFT model; the cost task needs no reversal skill): held-out
    pairwise and sign accuracy >= 0.95, by the trainer's evaluation and by the cost audit."""
    from ppo.tiny import factory, safety_data
    from rm.audit_cost import main as run_audit
    from rm.run_reward import main as run_reward

    base, data, out = str(tmp_path / "base"), str(tmp_path / "data"), str(tmp_path / "cost")
    factory.build_tiny(base, seed=42)
    safety_data.generate(data)
    run_reward(cost_argv(base, data, out))
    final = json.load(open(f"{out}/summary.json"))["final_eval"]
    print("tiny cost model, held-out:", {k: round(v, 4) for k, v in final.items() if k.startswith("cost/")})
    assert final["cost/accuracy"] >= 0.95 and final["cost/sign_accuracy"] >= 0.95, final
    report = run_audit(["config/tiny/cost_audit_argument.json", "--model_name_or_path", out, "--eval_datasets",
                        f"PKU-SafeRLHF/safety/test:1.0:{data}/safety_preference_eval.jsonl"])
    assert report["num_pairs"] == 300 and report["pairwise_accuracy"] >= 0.95 and report["sign_accuracy"] >= 0.95, report
