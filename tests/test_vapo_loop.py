"""VAPO's value pretraining and positive-example LM loss, and PaddleNLP's early stopping, in the
PPO/GRPO loop (ppo/trainer/updater.py, ppo/trainer/best_policy.py, ppo/trainer/loop.py).

Hand computation of the actor's loss (`test_actor_loss_adds_mu_times_the_positive_nll`), one
micro-batch of 2 rows, ratio 1 (log-probs equal to the old ones), token-mean over N = 5 tokens:
    logp = [[-1, -2, pad], [-0.5, -1.5, -3]], A = [[1, 2, 0], [-1, 0.5, 3]], scores [1, 0]
    policy loss  = -sum(A m) / 5 = -(1 + 2 - 1 + 0.5 + 3) / 5 = -1.1
    NLL (row 0 positive, 2 tokens) = -(-1 - 2) / 2 = 1.5;  total = -1.1 + 0.1 * 1.5 = -0.95
    d total / d logp = -A m / 5 - 0.1 m pos / 2 = [[-0.25, -0.45, 0], [0.2, -0.1, -0.6]]
"""
import json
import os
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

import tests.rule_reward_helpers  # noqa: F401  (registers test_rule_len: the response's length as its score)
from ppo.algos import positive_example_nll
from ppo.common.argument_parsing import REPO_ROOT
from ppo.entry.ppo_arguments import PPOTrainingArguments
from ppo.trainer.best_policy import EvalEarlyStop
from ppo.trainer.settings import UpdateSettings, slice_of
from ppo.trainer.updater import PPOUpdater
from tests.pinned_metrics import assert_pinned

CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "vapo_argument.json")


def t(rows, dtype="float32"):
    return paddle.to_tensor(np.array(rows, dtype=dtype))


def toy_updater(**given):
    args = PPOTrainingArguments(output_dir="/tmp/unused_vapo_loop", entropy_coeff=0.0, kl_loss_coeff=0.0, **given)
    state = SimpleNamespace(step=int(given.get("pretrain_critic_steps", 0)))  # past the pretraining steps
    return PPOUpdater(None, [], None, None, ptx=None, divergence=None, offload=None, state=state, ranks=None,
                      settings=slice_of(UpdateSettings, args), samples=None)


def toy_batch(rows=(0, 1)):
    logp = np.array([[-1.0, -2.0, 0.0], [-0.5, -1.5, -3.0]], dtype="float32")[list(rows)]
    logprobs = paddle.to_tensor(logp, stop_gradient=False)
    mb = SimpleNamespace(old_logprobs=t(logp), advantages=t(np.array([[1, 2, 0], [-1, 0.5, 3]])[list(rows)]),
                         response_mask=t(np.array([[1, 1, 0], [1, 1, 1]])[list(rows)]), rollout_is_weights=None,
                         ref_logprobs=t(logp), scores=t(np.array([1.0, 0.0])[list(rows)]))
    return mb, logprobs, {"logprobs": logprobs, "entropy": paddle.zeros_like(logprobs)}


def test_actor_loss_adds_mu_times_the_positive_nll():
    updater = toy_updater(positive_example_lm_coeff=0.1)
    mb, logprobs, forward = toy_batch()
    loss, stats = updater.actor_loss(mb, forward, 5.0, 2.0, positive_tokens=2.0)
    loss.backward()
    assert float(loss) == pytest.approx(-0.95, abs=1e-6)
    assert float(stats["loss/positive_lm_part"]) == pytest.approx(1.5)
    np.testing.assert_allclose(logprobs.grad.numpy(), [[-0.25, -0.45, 0.0], [0.2, -0.1, -0.6]], atol=1e-6)
    plain, plain_stats = toy_updater().actor_loss(*toy_batch()[::2], 5.0, 2.0)  # off: the policy loss alone
    assert float(plain) == pytest.approx(-1.1, abs=1e-6) and "loss/positive_lm_part" not in plain_stats


def test_positive_nll_split_over_micro_batches_sums_to_the_step_token_mean():
    """Each micro-batch divides by the step's positive-token count: the parts sum to the whole
    batch's token mean, and the gradients match."""
    updater = toy_updater(positive_example_lm_coeff=0.1)
    mb, logprobs, forward = toy_batch()
    whole, _ = updater.actor_loss(mb, forward, 5.0, 2.0, positive_tokens=2.0)
    whole.backward()
    parts, grads = 0.0, []
    for row in (0, 1):
        mb_i, logprobs_i, forward_i = toy_batch([row])
        part, _ = updater.actor_loss(mb_i, forward_i, 5.0, 2.0, positive_tokens=2.0)
        part.backward()
        parts += float(part)
        grads.append(logprobs_i.grad.numpy()[0])
    assert parts == pytest.approx(float(whole), abs=1e-6)
    np.testing.assert_allclose(np.stack(grads), logprobs.grad.numpy(), atol=1e-7)
    logp, mask = t([[-1.0, -2.0], [-4.0, -8.0]]), t([[1, 1], [1, 1]])
    assert float(positive_example_nll(logp, mask, paddle.to_tensor([True, False]), num_tokens=6)) == pytest.approx(0.5)


def test_eval_early_stop_counts_patience_and_says_why():
    stop = EvalEarlyStop("eval/accuracy", greater_is_better=True, patience=2, threshold=0.05)
    steps = ((1, 0.5), (2, 0.6), (3, 0.62), (4, 0.64))  # 0.62 and 0.64 beat 0.6, but by less than the threshold
    assert [stop.observe(s, {"eval/accuracy": v}) for s, v in steps] == [False, False, False, True]
    assert stop.summary() == {"early_stopped": {"step": 4, "metric": "eval/accuracy", "value": 0.64, "best": 0.64,
                                                "patience": 2, "threshold": 0.05}}
    again = EvalEarlyStop("eval/accuracy", True, 2, 0.05)
    again.set_state_dict(stop.state_dict())
    assert again.rule.best == 0.64 and again.rule.waited == 2 and again.summary() == stop.summary()  # the stop is kept
    with pytest.raises(KeyError, match="metric_for_best_model 'eval/accuracy' is not among"):
        again.observe(5, {"eval/score": 1.0})


def vapo_flags(model_dir, data_dir, out, *extra):
    return [CONFIG, "--actor_model_name_or_path", model_dir, "--reward_critic_model_name_or_path", model_dir,
            "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
            "--output_dir", out, "--logging_dir", f"{out}/vdl", "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
            "--per_device_train_batch_size", "8", "--max_dec_len", "6", "--evaluation_strategy", "no", "--save_steps", "0",
            "--num_sample_generations", "0", "--disable_tqdm", "true", "--rule_reward_scorers", "test_rule_len", *extra]


def metric_rows(out):
    return [json.loads(line) for line in open(f"{out}/metrics.jsonl") if "objective/scores" in line]


def snapshot(model, optimizer):
    return [p.numpy().copy() for p in model.parameters()], {k: np.array(v) for k, v in optimizer.state_dict().items()
                                                               if hasattr(v, "numpy")}


def reward_to_go(rewards, mask):
    return np.flip(np.cumsum(np.flip(rewards * mask, -1), -1), -1) * mask


def test_value_pretraining_then_vapo_with_the_positive_example_loss(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """Step 1 trains the critic alone on reward-to-go targets (critic_gae_lambda 0.5 would give
    others); step 2 trains both, the actor with mu x the positive examples' NLL."""
    import ppo.trainer.updater as updater_module
    from rl.run_rl import build_trainer

    out = str(tmp_path / "vapo")
    trainer = build_trainer(vapo_flags(tiny_model_dir, tiny_data_dir, out, "--max_steps", "2", "--pretrain_critic_steps", "1",
                                       "--critic_gae_lambda", "0.5", "--positive_example_lm_coeff", "0.1",
                                       "--positive_example_min_score", "4"))
    learner, actor, critic = trainer.learner, trainer.learner.actor, trainer.learner.critics[0].critic
    stage = trainer.experience.completion  # a pretraining step's update runs no actor pass to keep
    assert not stage.first_update_forward_reusable(8)
    trainer.state.step = 1
    assert stage.first_update_forward_reusable(8)
    trainer.state.step = 0
    seen = {"targets": [], "used": [], "actor": [], "after": []}
    critic_loss, actor_loss, learn, value_loss = learner.critic_loss, learner.actor_loss, learner.learn, updater_module.value_loss

    def recorded_value_loss(values, old_values, returns, *rest, **kw):
        seen["used"].append(returns.numpy())
        return value_loss(values, old_values, returns, *rest, **kw)

    def recorded_critic_loss(objective, mb, forward, *rest):
        trace = mb.objectives[objective.name]
        seen["targets"].append((trainer.state.step, trace.rewards.numpy(), trace.returns.numpy(), mb.response_mask.numpy()))
        return critic_loss(objective, mb, forward, *rest)

    def recorded_actor_loss(mb, forward, num_tokens, num_seqs, positive_tokens=None):
        loss, stats = actor_loss(mb, forward, num_tokens, num_seqs, positive_tokens)
        seen["actor"].append((mb.scores.numpy(), forward["logprobs"].numpy(), mb.response_mask.numpy(), positive_tokens,
                              float(stats["loss/positive_lm_part"])))
        return loss, stats

    def recorded_learn(*args):
        learn(*args)
        seen["after"].append((snapshot(actor.model, actor.optimizer), snapshot(critic.model, critic.optimizer),
                              actor.scheduler.last_epoch))

    learner.critic_loss, learner.actor_loss, learner.learn = recorded_critic_loss, recorded_actor_loss, recorded_learn
    monkeypatch.setattr(updater_module, "value_loss", recorded_value_loss)
    before = snapshot(actor.model, actor.optimizer), snapshot(critic.model, critic.optimizer), actor.scheduler.last_epoch
    trainer.train()

    (actor_1, critic_1, epoch_1), (actor_2, _, epoch_2) = seen["after"]
    for a, b in zip(before[0][0] + [before[2]], actor_1[0] + [epoch_1]):  # step 1: the actor and its schedule untouched
        np.testing.assert_array_equal(a, b)
    assert not before[0][1] and not actor_1[1] and actor_2[1]  # no optimiser state until its first step (step 2)
    assert epoch_2 == epoch_1 + 1 and max(np.abs(a - b).max() for a, b in zip(actor_1[0], actor_2[0])) > 0
    assert max(np.abs(a - b).max() for a, b in zip(before[1][0], critic_1[0])) > 0  # the critic trained at step 1
    assert len(seen["used"]) == len(seen["targets"]) and {r[0] for r in seen["targets"]} == {0, 1}
    for (step, rewards, returns, mask), used in zip(seen["targets"], seen["used"]):
        assert np.abs(rewards * mask).max() > 0
        want = reward_to_go(rewards, mask) if step == 0 else returns * mask  # step 0: Monte-Carlo returns
        np.testing.assert_allclose(used * mask, want, rtol=1e-5, atol=1e-6)
        if step == 0:  # the experience's own targets (GAE lambda 0.5) differ: a check that can fail
            assert not np.allclose(returns * mask, want, atol=1e-3)

    assert seen["actor"]  # step 2 only: each optimiser step is one micro-batch here
    parts = []
    for scores, logp, mask, positive_tokens, part in seen["actor"]:
        positive = scores >= 4
        assert positive_tokens == pytest.approx((mask * positive[:, None]).sum())
        want = -(logp * mask * positive[:, None]).sum() / max(positive_tokens, 1.0)
        assert part == pytest.approx(want, rel=1e-5, abs=1e-6)
        parts.append(part)
    assert any(p > 0 for p in parts)

    rows = metric_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["train/critic_pretrain"] == 1.0 and rows[1]["train/critic_pretrain"] == 0.0
    assert "loss/policy_avg" not in rows[0] and "loss/positive_lm" not in rows[0] and "train/actor_grad_norm" not in rows[0]
    assert rows[1]["loss/positive_lm"] == pytest.approx(np.mean(parts), rel=1e-5)
    for key in ("loss/value_avg", "objective/scores"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert_pinned("vapo_pretrain_positive", rows, rtol=3e-5, atol=1e-6)


def test_resume_in_the_middle_of_value_pretraining(tiny_model_dir, tiny_data_dir, tmp_path):
    """A run stopped after step 1 of 2 pretraining steps resumes from checkpoint-1: step 2 (the
    checkpoint's step counter, not a fresh count) still trains the critic alone, step 3 the actor."""
    from rl.run_rl import build_trainer

    out = str(tmp_path / "vapo")
    build_trainer(vapo_flags(tiny_model_dir, tiny_data_dir, out, "--max_steps", "1", "--pretrain_critic_steps", "2")).train()
    assert os.path.isdir(f"{out}/checkpoint-1")
    trainer = build_trainer(vapo_flags(tiny_model_dir, tiny_data_dir, out, "--max_steps", "3", "--pretrain_critic_steps", "2"))
    actor = trainer.learner.actor
    start = [p.numpy().copy() for p in actor.model.parameters()]  # the SFT weights, as checkpoint-1 holds them
    after = []
    learn = trainer.learner.learn

    def recorded_learn(*args):
        learn(*args)
        after.append([p.numpy().copy() for p in actor.model.parameters()])

    trainer.learner.learn = recorded_learn
    trainer.train()
    assert len(after) == 2  # steps 2 and 3
    for a, b in zip(start, after[0]):  # step 2: the SFT actor as it was
        np.testing.assert_array_equal(a, b)
    assert max(np.abs(a - b).max() for a, b in zip(start, after[1])) > 0  # step 3 trains it
    rows = {r["step"]: r for r in metric_rows(out)}
    assert [rows[s]["train/critic_pretrain"] for s in (1, 2, 3)] == [1.0, 1.0, 0.0]
    assert "loss/policy_avg" not in rows[2] and np.isfinite(rows[3]["loss/policy_avg"])


EARLY_STOP = ("--early_stopping", "true", "--early_stopping_patience", "2", "--early_stopping_threshold", "10",
              "--load_best_model_at_end", "true", "--metric_for_best_model", "accuracy", "--evaluation_strategy", "steps",
              "--eval_steps", "1", "--per_device_eval_batch_size", "32")


def test_early_stopping_stops_with_a_checkpoint_and_counts_on_after_a_resume(tiny_model_dir, tiny_data_dir, tmp_path):
    """Patience 2, threshold 10 (no accuracy can beat its best by 10): the evaluation of step 0
    sets the best, those of steps 1 and 2 count 1 and 2 and the second stops the run. Run 1 ends
    at step 1 (its max_steps) with the count 1 in checkpoint-1; the resumed run stops at step 2
    (without the restored count it would take step 2's evaluation as its first and stop at
    step 4); running it once more trains nothing (an early-stopped run is finished)."""
    from rl.run_rl import build_trainer

    out = str(tmp_path / "vapo")
    build_trainer(vapo_flags(tiny_model_dir, tiny_data_dir, out, "--max_steps", "1", *EARLY_STOP)).train()
    saved = json.load(open(f"{out}/checkpoint-1/trainer_state.json"))
    assert saved["early_stopping"]["waited"] == 1 and saved["early_stopping"]["best"] is not None
    assert saved["early_stopping"]["stopped"] is None
    summary = build_trainer(vapo_flags(tiny_model_dir, tiny_data_dir, out, "--max_steps", "5", *EARLY_STOP)).train()
    stopped = summary["early_stopped"]
    assert stopped["step"] == 2 and stopped["metric"] == "eval/accuracy" and stopped["patience"] == 2
    assert json.load(open(f"{out}/summary.json"))["early_stopped"] == stopped
    assert os.path.isdir(f"{out}/checkpoint-2") and not os.path.isdir(f"{out}/checkpoint-3")
    assert max(r["step"] for r in metric_rows(out)) == 2
    evaluations = [json.loads(line) for line in open(f"{out}/metrics.jsonl") if "eval/accuracy" in line]
    assert [e["step"] for e in evaluations] == [0, 1, 2] and stopped["value"] == evaluations[-1]["eval/accuracy"]
    again = build_trainer(vapo_flags(tiny_model_dir, tiny_data_dir, out, "--max_steps", "5", *EARLY_STOP)).train()
    assert again == json.load(open(f"{out}/summary.json")) and max(r["step"] for r in metric_rows(out)) == 2


def test_early_stopping_without_eval_datasets_is_refused(tiny_model_dir, tiny_data_dir, tmp_path):
    from ppo.common.argument_problems import ArgumentError
    from ppo.run_ppo import start_up

    flags = vapo_flags(tiny_model_dir, tiny_data_dir, str(tmp_path / "vapo"), *EARLY_STOP)
    i = flags.index("--eval_datasets")
    with pytest.raises(ArgumentError, match="early_stopping watches the evaluation metric: give eval_datasets"):
        start_up(flags[:i] + flags[i + 2:] + ["--eval_datasets", ""])
