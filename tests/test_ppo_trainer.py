"""PPO trainer on tiny models: which weights a step changes, resume equivalence,
NaN skipping, a LoRA actor sharing its base weights with the reference, and
2-process data-parallel / sharding runs."""
import json
import os

import numpy as np
import paddle
import pytest

from ppo.models.score_model import AutoModelForScore
from ppo.entry.ppo_trainer import NonFiniteError
from ppo.run_ppo import build_trainer
from tests.demo_config_flags import PPO_AS_BEFORE
from tests.tp_launch import launch_run

VOLATILE = ("timing_s/", "perf/")


def ppo_argv(model_dir, rm_dir, data_dir, out, *extra):
    return [
        "config/tiny/ppo_argument.json", *PPO_AS_BEFORE,
        "--actor_model_name_or_path", model_dir, "--reward_model_name_or_path", rm_dir,
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", "2", "--per_device_prompt_batch_size", "8", "--per_device_train_batch_size", "4",
        "--max_dec_len", "6", "--evaluation_strategy", "no", "--save_steps", "0", "--num_sample_generations", "1",
        "--learning_rate", "1e-3", "--critic_learning_rate", "1e-3", "--disable_tqdm", "true",
        *extra,
    ]


def trained(trainer, name):
    """The `TrainedModel` called `name` ("actor", "critic", "cost_critic") of a PPO run's update."""
    return {t.name: t for t in trainer.learner.trained}[name]


def weights(model):
    return {n: p.numpy().copy() for n, p in model.named_parameters()}


def read_metrics(out):
    return [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]


def test_step_updates_actor_and_critic_only(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "ppo")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "1", "--kl_coeff", "0.1"))
    m = trainer.passes.models
    before = {name: weights(getattr(m, name)) for name in ("actor", "reference", "reward", "critic")}
    summary = trainer.train()
    after = {name: weights(getattr(m, name)) for name in ("actor", "reference", "reward", "critic")}
    for name in ("reference", "reward"):
        for k in before[name]:
            np.testing.assert_array_equal(before[name][k], after[name][k], err_msg=f"{name}.{k} changed")
    for name in ("actor", "critic"):
        changed = [k for k in before[name] if not np.array_equal(before[name][k], after[name][k])]
        assert len(changed) == len(before[name]), f"{name}: only {len(changed)} of {len(before[name])} tensors moved"
    (line,) = [r for r in read_metrics(out) if "objective/scores" in r]
    for key in ("objective/kl", "loss/policy_avg", "loss/value_avg", "policy/clipfrac_avg", "val/ratio",
                "response_length/mean", "timing_s/rollout", "perf/tokens_per_s", "lr", "episode"):
        assert np.isfinite(line[key]), key
    assert line["episode"] == 8 and 1 <= line["response_length/mean"] <= 6
    assert abs(line["val/ratio"] - 1.0) < 0.05  # first update starts on-policy
    samples = [json.loads(ln) for ln in open(os.path.join(out, "samples.jsonl"))]
    assert samples and {"prompt", "response", "score"} <= set(samples[0])
    for sub in ("policy", "value"):
        assert os.path.isfile(os.path.join(out, sub, "config.json"))
    reloaded = AutoModelForScore.from_pretrained(os.path.join(out, "value"))
    np.testing.assert_array_equal(reloaded.score_head.weight.numpy(), after["critic"]["score_head.weight"])
    assert summary["steps"] == 1
    assert all(trained(trainer, name).optimizer.fused_steps > 0 for name in ("actor", "critic"))  # the one-op AdamW ran


def test_resume_reproduces_the_uninterrupted_run(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path, monkeypatch):
    common = ["--max_steps", "4", "--save_steps", "2", "--overwrite_output_dir", "false", "--normalize_reward", "true",
              "--evaluation_strategy", "steps", "--eval_steps", "2"]
    straight = str(tmp_path / "straight")
    build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, straight, *common)).train()

    crashed = str(tmp_path / "crashed")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, crashed, *common))
    original = trainer.train_step

    def crash_after_checkpoint():
        if trainer.state.step == 3:
            raise KeyboardInterrupt("killed")
        return original()

    trainer.train_step = crash_after_checkpoint
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert os.path.isdir(os.path.join(crashed, "checkpoint-2"))
    build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, crashed, *common)).train()

    clean = lambda rows: [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]
    a, b = clean(read_metrics(straight)), clean(read_metrics(crashed))
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 2, 3, 4, 4]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            np.testing.assert_allclose(ra[k], rb[k], rtol=1e-6, atol=1e-7, err_msg=f"step {ra['step']} {k}")
    wa = paddle.load(os.path.join(straight, "policy", "model_state.pdparams"))
    wb = paddle.load(os.path.join(crashed, "policy", "model_state.pdparams"))
    for k in wa:
        np.testing.assert_allclose(wa[k].numpy(), wb[k].numpy(), rtol=1e-6, atol=1e-7)


def test_nan_update_is_skipped_and_reported(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "nan")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "1", "--update_iters", "1",
                                     "--per_device_train_batch_size", "8"))
    original = trainer.learner.actor_loss
    calls = {"n": 0}

    def poisoned(mb, forward, num_tokens, num_seqs):
        loss, stats = original(mb, forward, num_tokens, num_seqs)
        calls["n"] += 1
        return loss * float("nan"), stats

    trainer.learner.actor_loss = poisoned
    before = weights(trainer.passes.models.actor)
    trainer.train()
    assert calls["n"] == 1
    after = weights(trainer.passes.models.actor)
    for k in before:
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)  # the poisoned update was not applied
    (line,) = [r for r in read_metrics(out) if "objective/scores" in r]
    assert line["train/nan_skipped_updates"] == 1.0


def test_repeated_nan_stops_the_run_naming_step_and_tensor(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "nan_stop")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "5", "--max_nan_skips", "1",
                                     "--update_iters", "1", "--per_device_train_batch_size", "8"))
    original = trainer.learner.actor_loss
    trainer.learner.actor_loss = lambda mb, fw, nt, ns: (lambda r: (r[0] * float("nan"), r[1]))(original(mb, fw, nt, ns))
    with pytest.raises(NonFiniteError, match=r"step 2: 2 consecutive updates had non-finite values \(last: loss of the actor\)"):
        trainer.train()


def test_lora_actor_shares_base_weights_with_reference(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "lora")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--use_lora", "true", "--max_steps", "1",
                                     "--kl_coeff", "0.1"))
    m = trainer.passes.models
    assert m.reference is None  # no second copy of the base weights
    with m.reference_mode() as ref:
        assert ref is m.actor
    base = {n: p for n, p in m.actor.named_parameters() if "lora_" not in n}
    assert all(p.stop_gradient for p in base.values())
    base_before = {n: p.numpy().copy() for n, p in base.items()}
    lora_before = {n: p.numpy().copy() for n, p in m.actor.named_parameters() if "lora_" in n}
    trainer.train()
    for n, p in m.actor.named_parameters():
        if "lora_" in n:
            continue
        assert p is base[n]
        np.testing.assert_array_equal(p.numpy(), base_before[n])
    assert any(not np.array_equal(p.numpy(), lora_before[n]) for n, p in m.actor.named_parameters() if "lora_" in n)
    assert os.path.isfile(os.path.join(out, "policy", "lora_config.json"))


def run_two_processes(mode, tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / mode)
    extra = ["--sharding", "stage1", "--sharding_parallel_degree", "2"] if mode == "sharding_stage1" else []
    launch_run("ppo/run_ppo.py", ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, *extra), out)  # fails with the logs
    summary = json.load(open(os.path.join(out, "summary.json")))
    fps = summary["actor_fingerprints"]
    assert len(fps) == 2 and fps[0] == fps[1]
    lines = [r for r in read_metrics(out) if "objective/scores" in r]
    assert [r["step"] for r in lines] == [1, 2] and lines[-1]["episode"] == 2 * 2 * 8
    return lines


@pytest.mark.slow
def test_two_process_runs_keep_ranks_in_sync(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """Data parallel and sharding stage 1 on two processes: ranks end with the same actor, and
    both layouts log the same losses and the same gradient norms (sharding's norm is taken
    after its gradient reduce, over the shards of both ranks, not of one rank's local
    gradients)."""
    dp = run_two_processes("data_parallel", tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path)
    sharded = run_two_processes("sharding_stage1", tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path)
    for key in ("loss/policy_avg", "loss/value_avg", "train/actor_grad_norm", "train/critic_grad_norm"):
        np.testing.assert_allclose([r[key] for r in sharded], [r[key] for r in dp], rtol=1e-4, err_msg=key)


def test_crash_during_save_keeps_previous_checkpoint(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path, monkeypatch):
    from ppo.checkpoints.checkpoint import list_checkpoints

    out = str(tmp_path / "atomic")
    argv = ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "4", "--save_steps", "2",
                    "--save_total_limit", "3", "--overwrite_output_dir", "false")
    trainer = build_trainer(argv)
    original = trainer.strategy.save_model
    calls = {"n": 0}

    def dies_on_second_checkpoint(model, path, tokenizer=None):
        calls["n"] += 1
        if calls["n"] == 3:  # checkpoint-2 saved policy+value; die inside checkpoint-4
            raise KeyboardInterrupt("killed mid-save")
        return original(model, path, tokenizer)

    monkeypatch.setattr(trainer.strategy, "save_model", dies_on_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert [step for step, _ in list_checkpoints(out)] == [2]  # the half-written one is not a checkpoint
    assert os.path.isdir(os.path.join(out, "tmp-checkpoint-4"))
    resumed = build_trainer(argv)
    assert resumed.state.resume() and resumed.state.step == 2


@pytest.mark.parametrize("estimator,rollout_logprobs", [("gae", "false"), ("grpo", "false"), ("gae", "true")])
def test_reused_first_update_forward_matches_a_separate_old_policy_pass(estimator, rollout_logprobs, tiny_model_dir, tiny_rm_dir,
                                                                        tiny_data_dir, tmp_path, monkeypatch):
    """With every row in one micro-batch, the update's first forward doubles as the old-policy
    (and old-value) pass: one actor/critic forward fewer per step, the same metrics and weights."""
    import ppo.passes.plain as passes_module  # every model pass of a one-process step

    calls = {"logprobs": 0, "values": 0}
    real_logprobs, real_values = passes_module.response_logprobs, passes_module.response_values

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(passes_module, "response_logprobs", counted("logprobs", real_logprobs))
    monkeypatch.setattr(passes_module, "response_values", counted("values", real_values))
    extra = ["--per_device_train_batch_size", "8", "--update_iters", "2", "--kl_coeff", "0.1",
             "--use_rollout_logprobs", rollout_logprobs]
    if estimator == "grpo":
        extra += ["--adv_estimator", "grpo", "--rollout_n", "2", "--per_device_prompt_batch_size", "4"]
    runs = {}
    for reuse in ("true", "false"):
        calls.update(logprobs=0, values=0)
        out = str(tmp_path / reuse)
        trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, *extra,
                                         "--reuse_first_update_forward", reuse))
        assert trainer.experience.completion.first_update_forward_reusable(8) == (reuse == "true")
        trainer.train()
        lines = [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_metrics(out) if "loss/policy_avg" in r]
        runs[reuse] = (dict(calls), lines, weights(trainer.passes.models.actor))
    (calls_on, lines_on, actor_on), (calls_off, lines_off, actor_off) = runs["true"], runs["false"]
    steps = 2
    # the old-policy pass is gone (with the rollout's log-probs as old ones there was none)
    assert calls_off["logprobs"] - calls_on["logprobs"] == (steps if rollout_logprobs == "false" else 0)
    has_critic = estimator == "gae"
    assert calls_off["values"] - calls_on["values"] == (steps if has_critic else 0)
    assert len(lines_on) == len(lines_off) == steps
    for on, off in zip(lines_on, lines_off):
        assert set(on) == set(off)
        for key in on:
            if isinstance(on[key], float):
                assert on[key] == pytest.approx(off[key], rel=1e-3, abs=1e-5), key
    for name in actor_on:
        np.testing.assert_allclose(actor_on[name], actor_off[name], rtol=1e-4, atol=1e-6, err_msg=name)
