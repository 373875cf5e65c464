"""rollout_placement split with several trainer or rollout ranks, as users run it: one
`paddle.distributed.launch` of CPU processes from a cold start, against the colocated run with
as many data-parallel ranks as the split run has trainer ranks (same tiny GRPO config as
tests/test_async_launch.py, 3 steps). At staleness 0, 2 trainer + 2 rollout ranks and 2 trainer
+ 1 rollout rank give the colocated 2-rank run's per-step metrics, samples and final weights bit
for bit (the gradient all-reduce adds the same two numbers), 1 trainer + 2 rollout ranks the
one-process run's (2 + 2 also as a two-node launch on one host, and resumed from a checkpoint);
at staleness 1 (each layout) each batch records the checksum of exactly the
trainer's weights of the version that sampled it. Three or four processes on two cores: slow suite."""
import json
import os
import subprocess
import sys

import pytest

from ppo.models.loading import load_causal_lm
from ppo.run_ppo import build_trainer
from ppo.strategy.rollout_link import weights_checksum
from tests.test_async_launch import STALE, env, logs, run_argv, steps
from tests.test_async_launch import assert_same_run as assert_same_async_run
from tests.test_reward_server import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3


def argv_of(model_dir, data_dir, out, *extra):
    argv = run_argv(model_dir, data_dir, out, *extra)
    i = argv.index("--max_steps")
    return argv[:i + 1] + [str(STEPS)] + argv[i + 2:]


def launch(out, argv, nproc, rollout_ranks=None):
    """`paddle.distributed.launch --nproc_per_node nproc`; split with `rollout_ranks` rollout ranks
    (None: colocated)."""
    split = ["--rollout_placement", "split", "--rollout_ranks", str(rollout_ranks)] if rollout_ranks else []
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir", f"{out}/launch",
           "ppo/run_ppo.py", *argv, *split]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + logs(out)
    return out


def assert_same_run(got, want, trainer_ranks):
    """Every compared metric of every step, the samples, the final weights and every trainer
    rank's weights fingerprint: bit for bit."""
    assert_same_async_run(got, want, STEPS)
    fingerprints = json.load(open(f"{got}/summary.json"))["actor_fingerprints"]
    assert fingerprints == json.load(open(f"{want}/summary.json"))["actor_fingerprints"]
    assert len(fingerprints) == trainer_ranks


def generated(out, rank):
    """The batches rollout rank `rank` reports it generated in the last launch (a launch appends to its logs)."""
    lines = [ln for ln in open(f"{out}/launch/workerlog.{rank}") if "rollout rank: generated" in ln]
    assert lines, logs(out)
    return int(lines[-1].split("rollout rank: generated ")[1].split()[0])


@pytest.fixture(scope="module")
def colocated_dp2(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """The colocated run on two data-parallel ranks."""
    out = str(tmp_path_factory.mktemp("colocated_dp2"))
    return launch(out, argv_of(tiny_model_dir, tiny_data_dir, out), 2)


@pytest.mark.slow
def test_two_trainer_and_two_rollout_ranks_are_the_colocated_dp2_run(colocated_dp2, tiny_model_dir, tiny_data_dir,
                                                                    tmp_path):
    out = str(tmp_path / "split_2x2")
    launch(out, argv_of(tiny_model_dir, tiny_data_dir, out), 4, rollout_ranks=2)
    assert_same_run(out, colocated_dp2, trainer_ranks=2)
    rows = steps(out)
    assert [r["async/weights_version"] for r in rows] == list(range(STEPS))
    assert [r["async/staleness_mean"] for r in rows] == [0.0] * STEPS
    assert [generated(out, 2), generated(out, 3)] == [STEPS, STEPS]  # rollout rank 2 + t serves trainer rank t


@pytest.mark.slow
def test_two_by_two_resumed_from_a_checkpoint_is_the_colocated_dp2_run(colocated_dp2, tiny_model_dir, tiny_data_dir,
                                                                      tmp_path):
    """Stopped after step 2 (its checkpoint), then the same command for 3 steps: every trainer rank
    tells the rollout ranks it is served by its checkpoint's sampler position and draw count, so
    step 3 is the uninterrupted run's, bit for bit."""
    out = str(tmp_path / "resumed_2x2")
    argv = argv_of(tiny_model_dir, tiny_data_dir, out, "--save_steps", "2", "--overwrite_output_dir", "false")
    i = argv.index("--max_steps")
    launch(out, argv[:i + 1] + ["2"] + argv[i + 2:], 4, rollout_ranks=2)
    assert os.path.exists(f"{out}/checkpoint-2/trainer_state.json") and len(steps(out)) == 2
    launch(out, argv, 4, rollout_ranks=2)
    assert_same_run(out, colocated_dp2, trainer_ranks=2)
    assert [generated(out, 2), generated(out, 3)] == [1, 1]  # the resumed launch generates step 3 only


@pytest.mark.slow
def test_two_node_launch_of_two_trainer_and_two_rollout_ranks(colocated_dp2, tiny_model_dir, tiny_data_dir, tmp_path):
    """`--nnodes 2 --master 127.0.0.1:PORT --rank {0,1}`, two processes each, as on two machines:
    node 0 holds the trainer ranks, node 1 the rollout ranks; the colocated 2-rank run bit for bit."""
    out, port = str(tmp_path / "two_nodes"), free_port()
    argv = argv_of(tiny_model_dir, tiny_data_dir, out) + ["--rollout_placement", "split", "--rollout_ranks", "2"]
    procs = [subprocess.Popen([sys.executable, "-m", "paddle.distributed.launch", "--nnodes", "2", "--nproc_per_node", "2",
                               "--master", f"127.0.0.1:{port}", "--rank", str(node), "--log_dir", f"{out}/node{node}",
                               "ppo/run_ppo.py", *argv], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outputs = [p.communicate()[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-2000:] + logs(out)
    assert_same_run(out, colocated_dp2, trainer_ranks=2)
    assert all("rollout rank: generated 3 batches" in open(f"{out}/node1/workerlog.{i}").read() for i in (0, 1))


@pytest.mark.slow
def test_two_trainer_ranks_and_one_rollout_rank_are_the_colocated_dp2_run(colocated_dp2, tiny_model_dir, tiny_data_dir,
                                                                        tmp_path):
    out = str(tmp_path / "split_2x1")
    launch(out, argv_of(tiny_model_dir, tiny_data_dir, out), 3, rollout_ranks=1)
    assert_same_run(out, colocated_dp2, trainer_ranks=2)
    assert generated(out, 2) == 2 * STEPS  # both trainer ranks' batches, every step


@pytest.mark.slow
def test_one_trainer_and_two_rollout_ranks_are_the_colocated_run(tiny_model_dir, tiny_data_dir, tmp_path):
    colocated = str(tmp_path / "colocated")
    build_trainer(argv_of(tiny_model_dir, tiny_data_dir, colocated)).train()
    out = str(tmp_path / "split_1x2")
    launch(out, argv_of(tiny_model_dir, tiny_data_dir, out), 3, rollout_ranks=2)
    assert_same_run(out, colocated, trainer_ranks=1)
    assert [generated(out, 1), generated(out, 2)] == [2, 1]  # steps 1 and 3, then step 2: the ranks take turns


@pytest.mark.slow
@pytest.mark.parametrize("nproc, rollout_ranks, batches", [(4, 2, [STEPS, STEPS]), (3, 1, [2 * STEPS]), (3, 2, [2, 1])])
def test_at_staleness_1_each_batch_records_the_checksum_of_the_weights_that_sampled_it(nproc, rollout_ranks, batches,
                                                                                      tiny_model_dir, tiny_data_dir,
                                                                                      tmp_path):
    """2 + 2, 2 + 1 and 1 + 2 ranks: batch k + 1 comes from the weights after step k on every
    rollout rank; the checksum each reports after applying them (every trainer rank checks it
    against its own weights) is that of the trainer's checkpoint of that version (version 0: the
    initial model)."""
    out = str(tmp_path / "stale")
    launch(out, argv_of(tiny_model_dir, tiny_data_dir, out, *STALE, "--save_steps", "1", "--save_total_limit", "10"),
           nproc, rollout_ranks=rollout_ranks)
    assert_stale_checksums(out, tiny_model_dir)
    assert [generated(out, rank) for rank in range(nproc - rollout_ranks, nproc)] == batches


def assert_stale_checksums(out, tiny_model_dir):
    """A 3-step staleness-1 run in `out` (saved every step): batch k + 1 came from the weights after
    step k, each batch's checksum is that of the trainer's checkpoint of its version (version 0:
    the initial model), and the stale batches were corrected."""
    rows = steps(out)
    assert [r["async/weights_version"] for r in rows] == [0, 0, 1]
    assert [r["async/staleness_mean"] for r in rows] == [0.0, 1.0, 1.0]
    for r in rows:
        version = int(r["async/weights_version"])
        path = f"{out}/checkpoint-{version}/policy" if version else tiny_model_dir
        assert r["async/weights_checksum"] == weights_checksum(list(load_causal_lm(path).parameters())), r["step"]
    assert all(abs(r["rollout/logprob_diff_max"]) > 1e-3 for r in rows[1:])  # the stale batches are corrected
