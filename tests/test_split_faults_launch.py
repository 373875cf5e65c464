"""Faults of rollout_placement split with several trainer and rollout ranks, through
`paddle.distributed.launch` as users run it (tiny GRPO config of tests/test_async_launch.py,
8 steps, staleness 0). A rollout rank killed with SIGKILL after step 2 (2 trainer + 2 rollout
ranks, and 2 + 1): every trainer rank stops, the checkpoint of the last completed step is saved
once and whole (2 + 2: rollout rank 3, and rollout rank 2, whose death can cut the weights
broadcast short before it reaches rank 3), each trainer's log names the dead rank in one line, and the same command
resumes and ends as the uninterrupted colocated 2-rank run, bit for bit. Trainer rank 1 of 2 + 2
killed the same way: the run stops, trainer rank 0 names it, the checkpoints on disk stay whole
and the same command resumes to the uninterrupted run. At staleness 1 (2 + 2, rollout rank 3
killed) both trainer ranks stop with one checkpoint and the rerun trains every step once. Each launch is bounded by a generous
subprocess timeout (a hang fails the test instead of stalling it). Four processes on two cores: slow suite."""
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.test_async_launch import STALE, assert_same_run, complete_steps, env, logs, run_argv, steps, wait_for, workers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8
LAUNCH_TIMEOUT_S = 900  # a bound on a launch that hangs, far above the 1-3 minutes one takes


def argv_of(model_dir, data_dir, out, *extra):
    argv = run_argv(model_dir, data_dir, out, "--overwrite_output_dir", "false", *extra)
    i = argv.index("--max_steps")
    return argv[:i + 1] + [str(STEPS)] + argv[i + 2:]


def launch_cmd(out, argv, nproc, rollout_ranks=None):
    split = ["--rollout_placement", "split", "--rollout_ranks", str(rollout_ranks)] if rollout_ranks else []
    return [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
            f"{out}/launch", "ppo/run_ppo.py", *argv, *split]


def launch(out, argv, nproc, rollout_ranks=None):
    proc = subprocess.run(launch_cmd(out, argv, nproc, rollout_ranks), cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + logs(out)
    return out


def kill_after_step_2(out, argv, nproc, rollout_ranks, victim):
    """Launch, SIGKILL global rank `victim` once step 2 is logged, wait for the launch to end
    (within LAUNCH_TIMEOUT_S); returns its exit status."""
    proc = subprocess.Popen(launch_cmd(out, argv, nproc, rollout_ranks), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: os.path.exists(f"{out}/metrics.jsonl") and complete_steps(out) >= 2, proc, out)
        pid = [p for p in workers(proc) if f"PADDLE_TRAINER_ID={victim}" in open(f"/proc/{p}/environ").read().split("\0")]
        os.kill(pid[0], signal.SIGKILL)
        proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    finally:
        if proc.poll() is None:  # a hang: end it, the assertion below reports it
            for p in workers(proc):
                os.killpg(p, signal.SIGKILL)
            proc.kill()
            proc.wait()
    return proc.returncode


def checkpoints(out):
    return sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))


def assert_whole(out, name):
    """A complete checkpoint: its state file, the policy's weights, both trainer ranks' states."""
    path = f"{out}/{name}"
    for f in ("trainer_state.json", "policy/model_state.pdparams", "rng_state.rank0.pkl", "rng_state.rank1.pkl",
              "policy_optimizer.rank0.pdopt", "policy_optimizer.rank1.pdopt"):
        assert os.path.exists(f"{path}/{f}"), (name, f)
    assert json.load(open(f"{path}/trainer_state.json"))["step"] == int(name.split("-")[1])


def assert_uninterrupted(out, want):
    assert_same_run(out, want, STEPS)
    fingerprints = json.load(open(f"{out}/summary.json"))["actor_fingerprints"]
    assert fingerprints == json.load(open(f"{want}/summary.json"))["actor_fingerprints"] and len(fingerprints) == 2


@pytest.fixture(scope="module")
def colocated_dp2(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """The uninterrupted colocated run on two data-parallel ranks."""
    out = str(tmp_path_factory.mktemp("colocated_dp2"))
    return launch(out, argv_of(tiny_model_dir, tiny_data_dir, out), 2)


@pytest.mark.slow
@pytest.mark.parametrize("nproc, rollout_ranks, victim", [(4, 2, 3), (4, 2, 2), (3, 1, 2)])
def test_a_dead_rollout_rank_stops_every_trainer_rank_with_one_checkpoint(nproc, rollout_ranks, victim, colocated_dp2,
                                                                          tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "dead_rollout")
    argv = argv_of(tiny_model_dir, tiny_data_dir, out)
    assert kill_after_step_2(out, argv, nproc, rollout_ranks, victim) != 0
    saved = checkpoints(out)
    trainer_logs = [open(f"{out}/launch/workerlog.{t}").read() for t in (0, 1)]
    assert len(saved) == 1, trainer_logs[0][-3000:]
    assert_whole(out, saved[0])
    step = int(saved[0].split("-")[1])
    assert 2 <= step < STEPS and len(steps(out)) == step
    named = f"RolloutRankLost: the rollout rank (rank {victim}) of this rollout_placement split run stopped answering"
    note = f"saved {out}/checkpoint-{step} (after step {step}) before stopping"
    for text in trainer_logs:  # every trainer rank stopped on it, naming the dead rank and the save in one line
        assert len([ln for ln in text.splitlines() if named in ln and note in ln]) == 1, text[-3000:]
    launch(out, argv, nproc, rollout_ranks)  # the same command: resumes from the checkpoint
    assert_uninterrupted(out, colocated_dp2)


@pytest.mark.slow
def test_a_dead_trainer_rank_stops_the_run_and_the_same_command_resumes(colocated_dp2, tiny_model_dir, tiny_data_dir,
                                                                        tmp_path):
    """Trainer rank 1 of 2 + 2 killed after step 2 (a checkpoint after every step): trainer rank 0
    names it and the newest checkpoint; every checkpoint left is whole; the rerun resumes."""
    out = str(tmp_path / "dead_trainer")
    argv = argv_of(tiny_model_dir, tiny_data_dir, out, "--save_steps", "1", "--save_total_limit", "10")
    assert kill_after_step_2(out, argv, 4, 2, 1) != 0
    saved = checkpoints(out)
    assert saved and all(int(name.split("-")[1]) < STEPS for name in saved), saved
    for name in saved:
        assert_whole(out, name)
    trainer_log = open(f"{out}/launch/workerlog.0").read()
    named = [ln for ln in trainer_log.splitlines()
             if "the trainer rank (rank 1) of this rollout_placement split run stopped answering" in ln]
    assert len(named) == 1 and f"the last checkpoint is {out}/{saved[-1]}" in named[0], trainer_log[-3000:]
    launch(out, argv, 4, 2)
    assert_uninterrupted(out, colocated_dp2)


@pytest.mark.slow
def test_at_staleness_1_a_dead_rollout_rank_stops_both_trainer_ranks_with_one_checkpoint(tiny_model_dir, tiny_data_dir,
                                                                                         tmp_path):
    """2 + 2 at staleness 1 (batches generated while the trainer ranks train): rollout rank 3
    killed after step 2 is noticed by a failed exchange (the weights broadcast or a batch) or, in
    a step longer than the launcher's second, by its SIGTERMs (the step ends, rank 3 is found
    gone); either way both trainer ranks save that step once, together, and name rank 3, and the
    same command resumes with every step once (the batches after the checkpoint come from its
    weights, so the run is not the uninterrupted one: docs/split_rollout.md)."""
    out = str(tmp_path / "dead_rollout_stale")
    argv = argv_of(tiny_model_dir, tiny_data_dir, out, *STALE)
    assert kill_after_step_2(out, argv, 4, 2, 3) != 0
    saved = checkpoints(out)
    assert len(saved) == 1, open(f"{out}/launch/workerlog.0").read()[-3000:]
    assert_whole(out, saved[0])
    step = int(saved[0].split("-")[1])
    assert 2 <= step < STEPS and len(steps(out)) == step
    named = "RolloutRankLost: the rollout rank (rank 3) of this rollout_placement split run stopped answering"
    note = f"saved {out}/checkpoint-{step} (after step {step}) before stopping"
    for t in (0, 1):
        text = open(f"{out}/launch/workerlog.{t}").read()
        assert len([ln for ln in text.splitlines() if named in ln and note in ln]) == 1, text[-3000:]
    launch(out, argv, 4, 2)
    assert [r["step"] for r in steps(out)] == list(range(1, STEPS + 1))  # nothing lost, nothing repeated
