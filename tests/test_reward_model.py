"""Score model and reward-model training: end index under padding, normaliser
persistence, losses equal to ppo/algos, a tiny real run, the reward audit."""
import json

import numpy as np
import paddle
import pytest

from ppo.algos import pairwise_reward_loss, tokenwise_pairwise_reward_loss
from ppo.models.causal_lm import last_token_index
from ppo.models.score_model import AutoModelForScore
from rm.reward_trainer import reward_loss


def test_end_index_under_left_and_right_padding():
    right = paddle.to_tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    left = paddle.to_tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    mixed = paddle.to_tensor([[0, 1, 1, 1, 0]])  # left-padded prompt + right-padded response
    assert last_token_index(right).numpy().tolist() == [2, 4, 0]
    assert last_token_index(left).numpy().tolist() == [4, 4, 4]
    assert last_token_index(mixed).numpy().tolist() == [3]


def test_same_sequence_scores_equal_left_or_right_padded(tiny_model_dir):
    model = AutoModelForScore.from_pretrained(tiny_model_dir)
    model.eval()
    ids_r = paddle.to_tensor([[1, 4, 7, 30, 31, 3, 3]])
    ids_l = paddle.to_tensor([[3, 3, 1, 4, 7, 30, 31]])
    out_r = model(ids_r, attention_mask=(ids_r != 3).astype("int64"))
    out_l = model(ids_l, attention_mask=(ids_l != 3).astype("int64"))
    np.testing.assert_allclose(out_r.end_scores.numpy(), out_l.end_scores.numpy(), atol=1e-5)
    np.testing.assert_allclose(out_r.end_scores.numpy(), out_r.scores.numpy()[:, 4], atol=1e-6)


@pytest.mark.parametrize("kind", ["RunningMeanStd", "ExponentialMovingAverage"])
def test_normaliser_statistics_survive_save_and_reload(tiny_model_dir, tmp_path, kind):
    model = AutoModelForScore.from_pretrained(tiny_model_dir, do_normalize=True, normalizer_type=kind, normalizer_momentum=0.5)
    model.train()
    rng = np.random.RandomState(0)
    for _ in range(3):
        ids = paddle.to_tensor(rng.randint(4, 90, size=(4, 6)))
        model(ids, attention_mask=paddle.ones_like(ids))
    assert float(model.normalizer_count) == 12.0 and float(model.normalizer_var) != 1.0
    model.eval()
    probe = paddle.to_tensor(rng.randint(4, 90, size=(3, 6)))
    before = model(probe).end_scores.numpy()
    model.save_pretrained(str(tmp_path / "rm"))
    reloaded = AutoModelForScore.from_pretrained(str(tmp_path / "rm"))
    reloaded.eval()
    assert reloaded.config.normalizer_type == kind and reloaded.config.do_normalize
    np.testing.assert_array_equal(reloaded(probe).end_scores.numpy(), before)


def hand_batch():
    """Two pairs sharing a prompt prefix [1, 4, 7]; worse answers differ from token 3 on."""
    better = [[1, 4, 7, 30, 31, 2, 3], [1, 4, 7, 40, 2, 3, 3]]
    worse = [[1, 4, 7, 31, 30, 2, 3], [1, 4, 7, 41, 42, 43, 2]]
    t = lambda x: paddle.to_tensor(x, dtype="int64")
    return {
        "better_input_ids": t(better), "better_attention_mask": (t(better) != 3).astype("int64"),
        "worse_input_ids": t(worse), "worse_attention_mask": (t(worse) != 3).astype("int64"),
    }


@pytest.mark.parametrize("loss_type", ["sequence-wise", "token-wise"])
def test_trainer_loss_matches_algos(tiny_model_dir, loss_type):
    model = AutoModelForScore.from_pretrained(tiny_model_dir)
    model.eval()
    batch = hand_batch()
    loss, stats = reward_loss(model, batch, loss_type, regularization=0.01)
    b = model(batch["better_input_ids"], attention_mask=batch["better_attention_mask"])
    w = model(batch["worse_input_ids"], attention_mask=batch["worse_attention_mask"])
    if loss_type == "sequence-wise":
        expected, _ = pairwise_reward_loss(b.end_scores, w.end_scores, regularization=0.01)
    else:
        expected, _ = tokenwise_pairwise_reward_loss(
            b.scores, w.scores, batch["better_input_ids"], batch["worse_input_ids"],
            batch["better_attention_mask"], batch["worse_attention_mask"], regularization=0.01,
        )
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
    assert 0.0 <= float(stats["rm/accuracy"]) <= 1.0


def test_reward_training_run_and_reload(tiny_model_dir, tiny_data_dir, tmp_path):
    from rm.audit_reward import main as run_audit
    from rm.run_reward import main as run_reward

    out = str(tmp_path / "rm")
    run_reward([
        "config/tiny/rm_argument.json", "--model_name_or_path", tiny_model_dir,
        "--train_datasets", f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl",
        "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{tiny_data_dir}/preference_eval.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "20", "--logging_steps", "5",
        "--eval_steps", "10", "--save_steps", "20", "--warmup_steps", "2", "--disable_tqdm", "true",
    ])
    lines = [json.loads(ln) for ln in open(f"{out}/metrics.jsonl")]
    assert [r["rm/loss"] for r in lines if "rm/loss" in r] and all(np.isfinite(r.get("rm/loss", 0.0)) for r in lines)
    evals = [r for r in lines if "rm/accuracy" in r]
    assert evals and all(0.0 <= r["rm/accuracy"] <= 1.0 for r in evals)
    summary = json.load(open(f"{out}/summary.json"))
    assert "rm/accuracy" in summary["final_eval"] and "rm/margin" in summary["final_eval"]
    reward = AutoModelForScore.from_pretrained(out)
    critic = AutoModelForScore.from_pretrained(out, score_type="critic", do_normalize=False)
    assert reward.config.score_type == "reward" and critic.config.score_type == "critic"
    np.testing.assert_array_equal(reward.score_head.weight.numpy(), critic.score_head.weight.numpy())
    report = run_audit([
        "--model_name_or_path", out, "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl",
        "--prompt_template", "USER: {input} ASSISTANT:", "--output_dir", str(tmp_path / "audit"),
    ])
    saved = json.load(open(tmp_path / "audit" / "audit.json"))
    assert saved == report and report["num_prompts"] == 32
    for kind in ("empty", "eos_only", "prompt_echo", "repeated_token", "truncated_half", "very_long"):
        assert 0.0 <= report[kind]["outranks_real_frac"] <= 1.0 and np.isfinite(report[kind]["mean_score"])


def test_audit_reports_are_written_printed_and_returned(tmp_path, capsys):
    from rm.audit_reward import write_report

    report = {"num_prompts": 2, "real": {"mean": 0.5}}
    assert write_report(report, str(tmp_path / "new"), "audit.json") is report
    assert json.load(open(tmp_path / "new" / "audit.json")) == report
    assert json.loads(capsys.readouterr().out) == report
