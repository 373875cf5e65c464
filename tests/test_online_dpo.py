"""Online DPO end to end on the tiny fixture model (dpo/run_online_dpo.py): what a run
writes, the score sources, the reference refresh, resume equivalence, the loss adapter,
and arguments refused before any model loads."""
import json
import os

import numpy as np
import paddle
import pytest

import tests.rule_reward_helpers  # noqa: F401  (registers the test_rule_* scorers)
from dpo.preference_objective import preference_objective
from dpo.run_online_dpo import build_trainer, main
from ppo.trainer.scoring import RewardServerScorer, ScoreModel
from tests.preference_shims import dpo_loss, pair_loss

VOLATILE = ("timing_s/", "perf/")


def online_argv(model_dir, data_dir, out, *extra):
    return [
        "config/tiny/online_dpo_argument.json",
        "--actor_model_name_or_path", model_dir, "--rule_reward_scorers", "test_rule_len",
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", "3", "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
        "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_dec_len", "6",
        "--eval_steps", "3", "--save_steps", "0", "--num_sample_generations", "1", "--learning_rate", "1e-3",
        "--disable_tqdm", "true", "--use_fused_adamw", "false",
        *extra,
    ]


def read_jsonl(path):
    return [json.loads(ln) for ln in open(path)]


def weights(model):
    return {n: p.numpy().copy() for n, p in model.named_parameters()}


def test_run_writes_metrics_samples_summary_and_a_reloadable_policy(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "online")
    summary = main(online_argv(tiny_model_dir, tiny_data_dir, out))
    rows = read_jsonl(f"{out}/metrics.jsonl")
    train = [r for r in rows if "objective/scores" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in train] == [1, 2, 3] and [r["step"] for r in evals] == [0, 3]
    for r in train:
        assert 1 <= r["online_dpo/num_pairs"] <= 4 and 0.0 <= r["online_dpo/tied_groups_frac"] <= 1.0
        assert r["online_dpo/score_gap"] > 0  # a pair's chosen answer scores above its rejected one
        assert np.isfinite([r["loss/dpo"], r["loss/sft"], r["rewards/margins"], r["loss/total"]]).all()
        assert 1 <= r["response_length/min"] <= r["response_length/mean"] <= r["response_length/max"] <= 6
        assert r["episode"] == 16 * r["step"] and r["timing_s/step"] > 0
    assert train[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # round 1 starts at the reference
    assert all(abs(r["rewards/margins"]) > 1e-6 for r in train[1:])  # later rounds: the policy has left the reference
    samples = read_jsonl(f"{out}/samples.jsonl")
    assert samples and all(len(s["chosen"]) > len(s["rejected"]) for s in samples)  # the length scorer's preference
    assert summary["steps"] == 3 and summary["final"]["online_dpo/num_pairs"] == train[-1]["online_dpo/num_pairs"]
    assert json.load(open(f"{out}/summary.json"))["steps"] == 3
    resolved = json.load(open(f"{out}/resolved_arguments.json"))
    assert resolved["OnlineDPOTrainingArguments"]["pair_selection"] == "best_worst"
    from ppo.models.loading import load_causal_lm

    reloaded = load_causal_lm(f"{out}/policy")
    saved = paddle.load(f"{out}/checkpoint-3/policy/model_state.pdparams")
    for name, p in reloaded.named_parameters():
        np.testing.assert_array_equal(p.numpy(), saved[name].numpy())


def test_a_round_update_lowers_the_loss_of_its_pairs(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpo.online_pairs import build_pairs
    from ppo.common.metrics import MetricAccumulator
    from ppo.experience import Experience, response_logprobs

    trainer = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "one"), "--update_iters", "3"))
    learner = trainer.learner
    exp = trainer.experience.scored_rollout()
    pairs = build_pairs(exp.scores.numpy(), 4)
    both = Experience.concat([exp.select(pairs.chosen.tolist()), exp.select(pairs.rejected.tolist())])
    learner.fill_reference(both)
    loss_of_all_pairs = learner.losses(len(pairs)).actor

    def loss_now():
        with paddle.no_grad():
            return loss_of_all_pairs(both, {"logprobs": response_logprobs(trainer.actor, both, 1.0)[0], "entropy": None})

    before, _ = loss_now()
    acc = MetricAccumulator()
    learner.update(both, len(pairs), acc)
    after, stats = loss_now()
    assert float(after) < float(before)
    assert float(stats["rewards/margins"]) > 0 and float(stats["rewards/accuracies"]) > 0.5
    assert len(acc.values["loss/total"]) == 3 * -(-len(pairs) // 4)  # update_iters x optimiser steps of 2 x 2 pairs


def test_reward_model_scores_and_all_pairs(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "rm")
    argv = online_argv(tiny_model_dir, tiny_data_dir, out, "--use_rule_reward", "false", "--rule_reward_scorers=",
                       "--reward_model_name_or_path", tiny_rm_dir, "--pair_selection", "all_pairs", "--max_steps", "1",
                       "--evaluation_strategy", "no")
    trainer = build_trainer(argv)
    assert isinstance(trainer.experience.scoring.objectives[0].scorer, ScoreModel)
    trainer.train()
    (row,) = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "objective/scores" in r]
    # continuous scores: 4 groups of 4 distinct answers give up to 6 pairs each, fewer for repeated answers
    assert 4 <= row["online_dpo/num_pairs"] <= 24 and row["online_dpo/tied_groups_frac"] == 0.0


def test_reward_server_scores(tiny_model_dir, tiny_data_dir, tmp_path):
    from tests.test_reward_server import ServerProcess

    server = ServerProcess("--scorer", "tests.rule_reward_helpers:_len_scorer")
    try:
        out = str(tmp_path / "server")
        trainer = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, out, "--use_rule_reward", "false",
                                            "--rule_reward_scorers=", "--use_rm_server", "true", "--reward_server", server.url,
                                            "--max_steps", "1", "--evaluation_strategy", "no"))
        assert isinstance(trainer.experience.scoring.objectives[0].scorer, RewardServerScorer)
        trainer.train()
    finally:
        server.stop()
    (row,) = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "objective/scores" in r]
    assert row["online_dpo/num_pairs"] >= 1 and row["online_dpo/score_gap"] > 0
    assert all(len(s["chosen"]) > len(s["rejected"]) for s in read_jsonl(f"{out}/samples.jsonl"))


def test_a_round_whose_groups_all_tie_takes_no_step(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "tied")
    # the untrained model never reverses a string exactly: every answer scores 0 under the exact-match rule
    trainer = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, out, "--rule_reward_scorers", "reverse",
                                        "--max_steps", "1", "--evaluation_strategy", "no"))
    before = weights(trainer.actor)
    trainer.train()
    (row,) = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "objective/scores" in r]
    assert row["online_dpo/num_pairs"] == 0 and row["online_dpo/tied_groups_frac"] == 1.0
    assert row["objective/scores"] == 0.0 and "loss/dpo" not in row
    after = weights(trainer.actor)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)


def test_lora_policy_uses_its_adapter_off_as_the_reference(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "lora")
    trainer = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, out, "--use_lora", "true", "--max_steps", "2",
                                        "--evaluation_strategy", "no"))
    assert trainer.passes.models.reference is None
    trainer.train()
    rows = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "objective/scores" in r]
    assert rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-7)  # a fresh adapter (B = 0) is the base model
    assert abs(rows[1]["rewards/margins"]) > 1e-7  # after one step the adapter moved the policy off the reference
    assert os.path.isfile(f"{out}/policy/lora_model_state.pdparams")


@pytest.mark.parametrize("loss_type", ["simpo", "orpo"])
def test_reference_free_losses_load_no_reference(loss_type, tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / loss_type)
    trainer = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, out, "--loss_type", loss_type, "--sft_loss_ratio", "0",
                                        "--max_steps", "1", "--evaluation_strategy", "no"))
    assert trainer.passes.models.reference is None and not trainer.learner.args.uses_reference
    trainer.train()
    (row,) = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "objective/scores" in r]
    assert np.isfinite(row["loss/dpo"]) and row["rewards/chosen"] < 0  # beta x mean log-prob per token
    assert "loss/sft" not in row


def test_reference_is_refreshed_every_ref_update_rounds(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "refresh")
    trainer = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, out, "--ref_update_rounds", "2",
                                        "--evaluation_strategy", "no", "--save_steps", "2", "--max_steps", "3",
                                        "--save_total_limit", "3"))
    start = weights(trainer.passes.models.reference)
    trainer.train()
    rows = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "objective/scores" in r]
    assert [r["online_dpo/reference_refreshed"] for r in rows] == [0.0, 1.0, 0.0]
    at_round_2 = paddle.load(f"{out}/checkpoint-2/policy/model_state.pdparams")
    saved_reference = paddle.load(f"{out}/checkpoint-2/reference/model_state.pdparams")
    for name, value in saved_reference.items():
        np.testing.assert_array_equal(value.numpy(), at_round_2[name].numpy())
    now = weights(trainer.passes.models.reference)
    assert any(not np.array_equal(now[k], start[k]) for k in start)
    # one optimiser step per round: round 2 measures the round-1 policy against the start, round 3 the
    # round-2 policy against itself (the refreshed reference)
    assert abs(rows[1]["rewards/margins"]) > 1e-6 and rows[2]["rewards/margins"] == pytest.approx(0.0, abs=1e-7)


def test_resume_reproduces_the_uninterrupted_run(tiny_model_dir, tiny_data_dir, tmp_path):
    common = ["--max_steps", "4", "--save_steps", "2", "--overwrite_output_dir", "false", "--eval_steps", "2",
              "--ref_update_rounds", "3"]
    straight = str(tmp_path / "straight")
    build_trainer(online_argv(tiny_model_dir, tiny_data_dir, straight, *common)).train()
    crashed = str(tmp_path / "crashed")
    trainer = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, crashed, *common))
    original = trainer.train_step

    def crash_in_round_3():
        if trainer.state.step == 2:
            raise KeyboardInterrupt("killed")
        return original()

    trainer.train_step = crash_in_round_3
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert os.path.isdir(os.path.join(crashed, "checkpoint-2"))
    resumed = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, crashed, *common))
    resumed.train()
    clean = lambda rows: [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]  # noqa: E731
    a, b = clean(read_jsonl(f"{straight}/metrics.jsonl")), clean(read_jsonl(f"{crashed}/metrics.jsonl"))
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 2, 3, 4, 4]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            np.testing.assert_allclose(ra[k], rb[k], rtol=1e-6, atol=1e-7, err_msg=f"step {ra['step']} {k}")
    wa = paddle.load(os.path.join(straight, "policy", "model_state.pdparams"))
    wb = paddle.load(os.path.join(crashed, "policy", "model_state.pdparams"))
    for k in wa:
        np.testing.assert_allclose(wa[k].numpy(), wb[k].numpy(), rtol=1e-6, atol=1e-7)


class LossArgs:
    beta, label_smoothing, simpo_gamma, dpop_lambda, sft_loss_ratio, pref_loss_ratio = 0.2, 0.0, 0.5, 50.0, 0.0, 1.0

    def __init__(self, loss_type):
        self.loss_type = loss_type


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "simpo", "orpo", "dpop"])
def test_online_loss_is_the_registry_family_loss(loss_type):
    """Online DPO's loss (`preference_objective` on the stacked pairs) is the family loss of the pairs."""
    logps = paddle.to_tensor([-3.0, -5.0, -6.0, -4.0])  # 2 pairs: chosen rows first
    ref = paddle.to_tensor([-4.0, -4.0, -5.0, -5.0])
    lengths = paddle.to_tensor([3.0, 4.0, 5.0, 2.0])
    loss, stats = preference_objective(LossArgs(loss_type), logps, lengths, ref)
    if loss_type == "dpop":
        expected, _ = pair_loss(logps[:2], logps[2:], ref[:2], ref[2:], beta=0.2, loss_type="dpop", dpop_lambda=50.0)
    else:
        nll = -logps[:2].sum() / lengths[:2].sum()
        expected, _ = dpo_loss(logps[:2], logps[2:], ref[:2], ref[2:], beta=0.2, loss_type=loss_type, chosen_lengths=lengths[:2],
                               rejected_lengths=lengths[2:], policy_chosen_nll=nll if loss_type == "orpo" else None)
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
    assert {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"} <= set(stats)
    if loss_type == "sigmoid":  # h = (-3 - -6) - (-4 - -5) = 2; pair 2: (-5 - -4) - (-4 - -5) = -2
        np.testing.assert_allclose(float(loss), np.mean([np.log1p(np.exp(-0.4)), np.log1p(np.exp(0.4))]), rtol=1e-6)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rollout_n", "1"], "rollout_n must be >= 2"),
        (["--loss_type", "kto"], "loss_type must be one of"),
        (["--pair_selection", "listwise"], "pair_selection must be one of"),
        (["--loss_type", "simpo", "--ref_update_rounds", "2"], "uses none"),
        (["--use_lora", "true", "--ref_update_rounds", "2"], "adapter off and cannot be refreshed"),
        (["--reward_critic_model_name_or_path", "x"], "trains no critic"),
        (["--ptx_datasets", "Jsonfile:1.0:x.jsonl"], "no ptx loss"),
        (["--pair_margin", "-1"], "pair_margin must be >= 0"),
        (["--use_rule_reward", "false", "--rule_reward_scorers="], "reward_model_name_or_path is required"),
    ],
)
def test_bad_arguments_are_refused_before_models_load(extra, message, tmp_path, monkeypatch):
    import dpo.run_online_dpo as entry

    monkeypatch.setattr(entry, "build_ppo_models", lambda *a, **k: pytest.fail("models loaded"))
    with pytest.raises(ValueError, match=message):
        build_trainer(online_argv(str(tmp_path / "no_model"), str(tmp_path), str(tmp_path / "out"), *extra))
