"""Saves that survive a kill at any instant (PPO): real processes (children of tests/warm_python.py's zygote) killed with SIGKILL at
chosen points of a save, then rerun with the same arguments; and a fresh run over an old
one's output directory (`overwrite_output_dir`)."""
import json
import os
import signal
import sys

import numpy as np
import paddle
import pytest

from ppo.checkpoints.checkpoint import list_checkpoints
from tests.test_ppo_trainer import ppo_argv, read_metrics
from tests.warm_python import run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs run_ppo.main in this process after arranging a SIGKILL at the n-th matching call.
KILLER = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from tests.warm_python import rebind
import ppo.checkpoints.checkpoint as ckpt
where, n = sys.argv[2], int(sys.argv[3])
calls = [0]

def die_at_nth(match, original):
    def wrapped(*args, **kwargs):
        if match(*args):
            calls[0] += 1
            if calls[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)
    return wrapped

if where == "save_checkpoint":  # before checkpoint-<step> is written
    original = ckpt.save_checkpoint
    ckpt.save_checkpoint = die_at_nth(lambda *a: True, original)
    rebind(original, ckpt.save_checkpoint)
elif where == "replace_policy":  # checkpoint written, tmp-policy copied, not yet moved
    original = ckpt.replace_dir_atomically
    ckpt.replace_dir_atomically = die_at_nth(lambda tmp, final: final.endswith("policy"), original)
    rebind(original, ckpt.replace_dir_atomically)
elif where == "rename_into_policy":  # policy moved to policy.old, tmp-policy not yet moved in
    ckpt.os.rename = die_at_nth(lambda src, dst: dst.endswith(os.sep + "policy"), os.rename)
import ppo.trainer.run_state
ppo.trainer.run_state.save_checkpoint = ckpt.save_checkpoint
from ppo.run_ppo import main
main(sys.argv[4:])
"""


def run_ppo(argv, kill_where=None, kill_at=0):
    cmd = [sys.executable, "-c", KILLER, REPO, kill_where or "none", str(kill_at), *argv]
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    return run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def policy_weights(path):
    return paddle.load(os.path.join(path, "model_state.pdparams"))


@pytest.mark.parametrize(
    "where,nth",
    [pytest.param("save_checkpoint", 2, marks=pytest.mark.slow), ("replace_policy", 2),
     pytest.param("rename_into_policy", 1, marks=pytest.mark.slow)],
)
def test_sigkill_during_save_then_rerun_completes(where, nth, tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / where)
    argv = ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "4", "--save_steps", "2",
                    "--overwrite_output_dir", "false", "--save_total_limit", "2")
    killed = run_ppo(argv, where, nth)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    left = sorted(os.listdir(out))
    if where != "save_checkpoint":
        assert any(n.startswith("tmp-") or n.endswith(".old") for n in left), left  # the kill left debris

    rerun = run_ppo(argv)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    names = os.listdir(out)
    assert not [n for n in names if n.startswith("tmp-") or n.endswith(".old")], names
    assert [s for s, _ in list_checkpoints(out)] == [2, 4]
    final, ckpt4 = policy_weights(os.path.join(out, "policy")), policy_weights(os.path.join(out, "checkpoint-4", "policy"))
    for k in final:
        np.testing.assert_array_equal(final[k].numpy(), ckpt4[k].numpy(), err_msg=k)  # policy/ is the last step's
    steps = [r["step"] for r in read_metrics(out)]
    assert steps == [1, 2, 3, 4]
    samples = [json.loads(ln) for ln in open(os.path.join(out, "samples.jsonl"))]
    per_step = {s: sum(1 for r in samples if r["step"] == s) for s in {r["step"] for r in samples}}
    assert sorted(per_step) == [1, 2, 3, 4] and len(set(per_step.values())) == 1, per_step  # no replayed duplicates
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["steps"] == 4


def test_fresh_run_over_an_old_one_keeps_only_its_own_checkpoints(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """Finding 2: rotation by step number let a shorter overwriting run delete its own checkpoints."""
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "reused")
    common = ["--save_steps", "1", "--save_total_limit", "2"]
    build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "4", *common)).train()
    assert [s for s, _ in list_checkpoints(out)] == [3, 4]
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "2",
                                     "--overwrite_output_dir", "true", *common))
    trainer.train()
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]
    final, ckpt2 = policy_weights(os.path.join(out, "policy")), policy_weights(os.path.join(out, "checkpoint-2", "policy"))
    live = {n: p.numpy() for n, p in trainer.passes.models.actor.named_parameters()}
    for k in final:
        np.testing.assert_array_equal(final[k].numpy(), ckpt2[k].numpy(), err_msg=k)
        np.testing.assert_array_equal(final[k].numpy(), live[k], err_msg=k)
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    assert {json.loads(ln)["step"] for ln in open(os.path.join(out, "samples.jsonl"))} == {1, 2}
    resumed = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "2",
                                     "--overwrite_output_dir", "false", *common))
    assert resumed.state.resume() and resumed.state.step == 2


def test_resume_falls_back_when_the_newest_checkpoint_is_damaged(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "damaged")
    argv = ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "2", "--save_steps", "1",
                    "--overwrite_output_dir", "false", "--save_total_limit", "2")
    build_trainer(argv).train()
    open(os.path.join(out, "checkpoint-2", "policy_optimizer.rank0.pdopt"), "wb").close()  # emptied by a full disk
    resumed = build_trainer(argv)
    assert resumed.state.resume() and resumed.state.step == 1


def test_clean_partial_saves_and_rotation_by_age(tmp_path):
    from ppo.checkpoints.checkpoint import clean_partial_saves, rotate_checkpoints

    out = tmp_path
    for name in ("tmp-policy", "tmp-checkpoint-6", "value.old", "policy", "policy.old"):
        (out / name).mkdir()
    (out / "policy" / "w").write_text("new")
    done = clean_partial_saves(str(out))
    assert sorted(os.listdir(out)) == ["policy", "value"]
    assert (out / "policy" / "w").read_text() == "new" and len(done) == 4
    for step, age in ((30, 1), (5, 2), (10, 3)):  # an older run's checkpoint-30 is the oldest
        d = out / f"checkpoint-{step}"
        d.mkdir()
        (d / "trainer_state.json").write_text("{}")
        os.utime(d / "trainer_state.json", (age * 1000, age * 1000))
    deleted = rotate_checkpoints(str(out), 2)
    assert [os.path.basename(p) for p in deleted] == ["checkpoint-30"]
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint")) == ["checkpoint-10", "checkpoint-5"]
