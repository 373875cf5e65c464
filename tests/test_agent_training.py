"""The PPO/GRPO trainer on multi-turn trajectories (`env_name`): the keys are checked before any
model loads, the policy trains on its own tokens only (the gradient of the loss is 0 at every
tool and glue token, checked on the loss, and GAE runs over the policy's tokens), a tool pool
that keeps failing and a reward that cannot be computed stop the run with one clear message, and
a run killed with SIGKILL and rerun ends as the uninterrupted run."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppo.algos import gae_advantages_and_returns
from ppo.common.argument_problems import UsageError
from ppo.experience import loss_view, response_logprobs, response_slice
from ppo.run_ppo import build_trainer, start_up
from ppo.scorers import ScorerError
from ppo.trainer.agent_rollout import ToolPoolError
from ppo.trainer.loop import StepClock
from tests.test_ppo_trainer import ppo_argv, read_metrics

ECHO = ["--env_name", "tests.agent_helpers:EchoEnv", "--env_kwargs", '{"turns": 3}', "--max_turns", "4",
        "--max_total_len", "110", "--max_dec_len", "5"]


def grpo_agent_argv(model_dir, data_dir, out, *extra):
    """GRPO with the echo environment (every turn's end is a call, answered "ans"), scored by a
    graded rule scorer (`text_sum_scorer`) so that advantages are not 0."""
    return ["config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", model_dir,
            "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl", "--eval_datasets", "",
            "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "1", "--evaluation_strategy", "no",
            "--save_steps", "0", "--num_sample_generations", "1", "--disable_tqdm", "true",
            "--rule_reward_scorers", "tests.agent_helpers:text_sum_scorer", "--rollout_n", "4",
            "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "8", "--learning_rate", "1e-3",
            *ECHO, *extra]


def made_experience(trainer):
    exp, stats = trainer.experience.make(StepClock())
    real = exp.attention_mask.numpy()[:, exp.prompt_len:]
    policy = exp.response_mask.numpy()
    assert ((real == 1) & (policy == 0)).sum() > 0, "the trajectories hold tool and glue tokens"
    return exp, stats, real, policy


def test_agent_keys_are_checked_before_models_load(tiny_model_dir, tiny_data_dir, tmp_path):
    """An unknown environment, env_kwargs its class does not take, env_kwargs that are not a
    JSON object and use_fusemt false: each named, all in one error from the start-up pass."""
    argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "bad"), "--env_name", "no_such_env")
    with pytest.raises(UsageError) as err:
        start_up(argv)
    assert "env_name no_such_env: unknown environment 'no_such_env'; valid names: " in str(err.value)
    assert "tools" in str(err.value).split("valid names: ")[1]
    argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "bad"), "--env_kwargs", '{"colour": 1}',
                           "--use_fusemt", "false")
    with pytest.raises(UsageError) as err:
        start_up(argv)
    message = str(err.value)
    assert "env_kwargs {'colour': 1} do not fit environment 'tests.agent_helpers:EchoEnv'" in message
    assert "env_name with use_fusemt false" in message
    with pytest.raises(UsageError) as err:
        start_up(grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "bad"), "--env_kwargs", "[1]"))
    assert "env_kwargs must be a JSON object, got '[1]'" in str(err.value)
    assert not os.path.exists(str(tmp_path / "bad" / "resolved_arguments.json"))


def test_grpo_trains_on_policy_tokens_only(tiny_model_dir, tiny_data_dir, tmp_path):
    """The actor loss (policy loss, entropy bonus and KL term) of a trajectory batch, its
    log-probs computed at every real token: d loss / d log-prob is 0 at every tool and glue
    token and non-zero at policy tokens; garbage written into the old log-probs, reference
    log-probs and advantages of the tool tokens leaves the actor's parameter gradients unchanged."""
    trainer = build_trainer(grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "g"), "--entropy_coeff", "0.1",
                                            "--kl_loss_coeff", "0.1"))
    exp, stats, real, policy = made_experience(trainer)
    assert stats["agent/tool_calls_mean"] == 2.0 and stats["tool/echo/calls"] == 16.0
    actor = trainer.passes.models.actor
    every = exp.select(list(range(len(exp))))
    every.response_mask = paddle.to_tensor(real.astype("float32"))  # log-probs at tool tokens too
    n_tokens, n_seqs = float(policy.sum()), float(len(exp))

    def loss_and_grads(e):
        actor.clear_gradients()
        lp, ent = response_logprobs(actor, every, 1.0, with_entropy=True)  # the config's temperature
        loss, _ = trainer.learner.actor_loss(loss_view(e.prompt_len, e.loss_tensors()), {"logprobs": lp, "entropy": ent},
                                             n_tokens, n_seqs)
        d_lp, d_ent = paddle.grad(loss, [lp, ent], retain_graph=True)
        loss.backward()
        return d_lp.numpy(), d_ent.numpy(), {n: p.grad.numpy().copy() for n, p in actor.named_parameters()}

    d_lp, d_ent, grads = loss_and_grads(exp)
    tool = (real == 1) & (policy == 0)
    assert np.all(d_lp[tool] == 0) and np.all(d_ent[tool] == 0)
    assert np.all(d_lp[policy == 1] != 0)
    garbage = exp.select(list(range(len(exp))))
    noise = paddle.to_tensor(np.where(tool, 7.5, 0.0).astype("float32"))
    for name in ("old_logprobs", "ref_logprobs", "advantages"):
        setattr(garbage, name, getattr(exp, name) + noise)
    _, _, garbage_grads = loss_and_grads(garbage)
    for name, g in grads.items():
        np.testing.assert_array_equal(garbage_grads[name], g, err_msg=name)


def test_ppo_gae_and_value_loss_over_policy_tokens(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """PPO with a critic: each row's advantages are GAE over its policy tokens alone (the tool
    tokens skipped, as if they were not there), 0 at tool tokens; the value loss has zero
    gradient at tool tokens."""
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, str(tmp_path / "p"), *ECHO, "--eval_datasets", "",
                                     "--normalize_advantage", "false", "--gamma", "0.9", "--gae_lambda", "0.8"))
    exp, _, real, policy = made_experience(trainer)
    trace = exp.objectives["reward"]
    adv, values, rewards = trace.advantages.numpy(), trace.values.numpy(), trace.rewards.numpy()
    assert np.all(adv[policy == 0] == 0)
    for b in range(len(exp)):
        idx = np.flatnonzero(policy[b])
        compact = [paddle.to_tensor(x[b, idx][None]) for x in (values, rewards, np.ones_like(values))]
        expected, _ = gae_advantages_and_returns(*compact, gamma=0.9, gae_lambda=0.8)
        np.testing.assert_allclose(adv[b, idx], expected.numpy()[0], rtol=1e-5, atol=1e-6)
    critic = trainer.passes.models.critic
    scores = critic(input_ids=exp.sequences, attention_mask=exp.attention_mask, position_ids=exp.position_ids).scores
    v = response_slice(scores, exp.prompt_len, exp.response_ids.shape[1])
    objective = trainer.learner.critics[0]
    loss, _ = trainer.learner.critic_loss(objective, loss_view(exp.prompt_len, exp.loss_tensors()), {"values": v},
                                          float(policy.sum()), float(len(exp)))
    (d_v,) = paddle.grad(loss, [v])
    assert np.all(d_v.numpy()[(real == 1) & (policy == 0)] == 0) and np.any(d_v.numpy()[policy == 1] != 0)


def test_a_failing_tool_pool_stops_the_run_after_saving(tiny_model_dir, tiny_data_dir, tmp_path):
    """The environment raises on every step (every row ends with env_error): at the second such
    step the run stops, saying why, after saving the last completed step (with the failure
    count, so that a rerun whose tools still fail stops after one more such step)."""
    out = str(tmp_path / "fail")
    trainer = build_trainer(grpo_agent_argv(tiny_model_dir, tiny_data_dir, out, "--env_name",
                                            "tests.agent_helpers:RaisingEnv", "--tool_failure_steps", "2",
                                            "--max_steps", "4"))
    with pytest.raises(ToolPoolError) as err:
        trainer.train()
    message = str(err.value)
    assert "step 2: the tools failed on 8 of 8 rows, more than max_tool_failure_frac=0.5 for 2 steps" in message
    assert "last failure: the environment: env_error: RuntimeError('environment bug')" in message
    assert f"saved {out}/checkpoint-1 (after step 1) before stopping" in message
    assert os.path.isdir(f"{out}/checkpoint-1/policy")
    assert json.load(open(f"{out}/checkpoint-1/trainer_state.json"))["tool_failures"] == {"streak": 2}
    assert [r["agent/env_errors"] for r in read_metrics(out) if "agent/env_errors" in r] == [8.0]


@pytest.mark.slow
def test_the_entry_point_says_why_the_tools_stopped_the_run_in_one_message(tiny_model_dir, tiny_data_dir, tmp_path):
    """ppo/run_ppo.py with an environment that fails on every row: exit status 1 and one error
    line naming the environment's last error, no traceback."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "cli"), "--env_name",
                           "tests.agent_helpers:RaisingEnv", "--tool_failure_steps", "1")
    proc = subprocess.run([sys.executable, "ppo/run_ppo.py", *argv], cwd=repo, capture_output=True, text=True,
                          env=dict(os.environ, MKL_DEBUG_CPU_TYPE="5"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error: " in line]
    assert len(errors) == 1 and errors[0].startswith("run_ppo.py: error: step 1: the tools failed on 8 of 8 rows")
    assert "last failure: the environment: env_error: RuntimeError('environment bug')" in errors[0]


def test_a_reward_that_cannot_be_computed_stops_the_run(tiny_model_dir, tiny_data_dir, tmp_path):
    """A rule scorer that raises on a trajectory stops the run naming the scorer and the prompt."""
    trainer = build_trainer(grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "r"), "--rule_reward_scorers",
                                            "tests.agent_helpers:fails_on_tool_answer"))
    with pytest.raises(ScorerError) as err:
        trainer.train()
    assert "cannot score a tool answer" in str(err.value) and "prompt 'Reverse:" in str(err.value)


@pytest.mark.slow
def test_kill_9_and_rerun_equals_an_uninterrupted_run(tiny_model_dir, tiny_data_dir, tmp_path):
    """GRPO on trajectories killed with SIGKILL mid-save and at a random moment, rerun each time:
    the same final weights and metrics (tool and agent counts included) as the run never killed."""
    from tests.test_random_kills import assert_same_run, kill_plan, run_killed_then_resumed, timed_attempt

    def argv(out):
        return grpo_agent_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "4", "--save_steps", "1",
                               "--overwrite_output_dir", "false", "--save_total_limit", "2")

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    proc, wall = timed_attempt("ppo", argv(straight))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert run_killed_then_resumed("ppo", argv(resumed), kill_plan(45, wall, (2, 6), (2, 4))[:3]) >= 2
    assert_same_run(straight, resumed, "policy")
    rows = read_metrics(resumed)
    assert [r["step"] for r in rows if "agent/turns_mean" in r] == [1, 2, 3, 4]
    assert all(r["tool/echo/calls"] == 16.0 for r in rows if "agent/turns_mean" in r)
