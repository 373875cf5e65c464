"""rollout_placement split with tensor parallelism, as users run it: one cold
`paddle.distributed.launch` of CPU processes (the test stand-ins of the model-parallel collectives
installed, tests/tp_launch.py), the tiny GRPO config of tests/test_split_many_launch.py (3 steps).

- Trainer TP2 beside two rollout replicas of one rank (4 processes: ranks 0-1 one tensor-parallel
  group, one data rank; ranks 2 and 3 take its batches in turn): the trainer ranks gather their
  slices into whole weights and rank 0 broadcasts them. At staleness 0 the colocated TP2 run
  (2 processes) bit for bit: its rollout generates from the same gathered whole weights with the
  same seeded draws, and the trainer computes its reference log-probs with its own TP2 pass (a
  rollout rank's whole-model pass would sum them in another order). At staleness 1 each batch
  records the checksum of exactly the trainer's checkpoint of the version that sampled it.
  Resumed from a checkpoint after step 2, the uninterrupted run bit for bit.
- Trainer TP1 beside one rollout replica of TP2 (3 processes, `rollout_ranks 2`,
  `rollout_tensor_parallel_degree 2`): each replica rank holds and receives only its slice of
  the weights (heads, MLP columns and rows, vocabulary; about half the model's parameter bytes,
  written to rollout_rank_<rank>.json), they generate together and the first sends the batch. Against the colocated one-process run at staleness 0: the same samples; every
  metric within 1e-6 x max(1, |value|) and the final weights within 1e-6 (measured 7.0e-8 and
  1.2e-7): the replica all-reduces o_proj's, down_proj's and the embedding's partial sums of two
  slices, so its logits, and the rollout log-probs the update reads, differ in the last bits.
  At staleness 1 the checksums as above.
- Trainer TP2 x DP2 beside two rollout ranks (6 processes: data ranks {0, 1} and {2, 3}, fleet's
  data axis confined to the trainer ranks, their gradients summed over [0, 2] and [1, 3]): the
  colocated TP2 x DP2 run (4 processes) bit for bit.
- Trainer TP2 beside one replica of TP2 (4 processes): the colocated TP2 run with
  `rollout_tensor_parallel_degree 2` bit for bit (the slices the replica cuts from the whole
  weights are the colocated TP2 model's own).
Three to six processes on two cores: slow suite."""
import json

import numpy as np
import pytest

from ppo.models.adapters import load_causal_lm
from ppo.run_ppo import build_trainer
from tests.test_async_launch import NOT_COMPARED, STALE, policy_weights, steps
from tests.test_split_many_launch import STEPS, argv_of, assert_same_run, assert_stale_checksums, generated
from tests.tp_launch import cold_launch_run

pytestmark = pytest.mark.slow
TP2 = ("--tensor_parallel_degree", "2")
METRIC_TOL = 1e-6  # x max(1, |value|): measured 7.0e-8 (loss/policy_avg and objective/kl of step 1)
WEIGHT_TOL = 1e-6  # measured 1.2e-7


def split_args(rollout_ranks):
    return ("--rollout_placement", "split", "--rollout_ranks", str(rollout_ranks))


def launch(out, argv, nproc, *split):
    return cold_launch_run("ppo/run_ppo.py", [*argv, *split], out, nproc=nproc, cpu_tp_standins=True)


def samples(out):
    return [(s["step"], s["prompt"], s["response"], s["score"]) for s in map(json.loads, open(f"{out}/samples.jsonl"))]


@pytest.fixture(scope="module")
def colocated_tp2(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """The colocated run on one tensor-parallel group of two ranks."""
    out = str(tmp_path_factory.mktemp("colocated_tp2"))
    return launch(out, argv_of(tiny_model_dir, tiny_data_dir, out, *TP2), 2)


def test_trainer_tp2_beside_two_replicas_is_the_colocated_tp2_run(colocated_tp2, tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "split_tp2x2")
    launch(out, argv_of(tiny_model_dir, tiny_data_dir, out, *TP2), 4, *split_args(2))
    assert_same_run(out, colocated_tp2, trainer_ranks=2)
    rows = steps(out)
    assert [r["async/weights_version"] for r in rows] == list(range(STEPS))
    assert [r["async/staleness_mean"] for r in rows] == [0.0] * STEPS
    assert [generated(out, 2), generated(out, 3)] == [2, 1]  # steps 1 and 3, then step 2: the replicas take turns


def test_trainer_tp2_resumed_from_a_checkpoint_is_the_colocated_tp2_run(colocated_tp2, tiny_model_dir, tiny_data_dir,
                                                                        tmp_path):
    """Stopped after step 2 (its merged checkpoint), then the same command for 3 steps: the trainer
    ranks load the checkpoint back into their slices, trainer rank 0 tells both replicas its
    sampler position and draw count, and step 3 is the uninterrupted run's, bit for bit."""
    out = str(tmp_path / "resumed_tp2")
    argv = argv_of(tiny_model_dir, tiny_data_dir, out, *TP2, "--save_steps", "2", "--overwrite_output_dir", "false")
    i = argv.index("--max_steps")
    launch(out, argv[:i + 1] + ["2"] + argv[i + 2:], 4, *split_args(2))
    assert len(steps(out)) == 2
    launch(out, argv, 4, *split_args(2))
    assert_same_run(out, colocated_tp2, trainer_ranks=2)
    assert [generated(out, 2), generated(out, 3)] == [1, 0]  # the resumed launch generates step 3 only


RTP2 = ("--rollout_tensor_parallel_degree", "2")
STALE_CASES = {  # name: (processes, arguments, {rollout rank: batches it generates})
    "tp2_trainer_two_replicas": (4, (*TP2, *split_args(2)), {2: 2, 3: 1}),
    "tp1_trainer_one_tp2_replica": (3, (*split_args(2), *RTP2), {1: STEPS, 2: STEPS}),
}


@pytest.mark.parametrize("case", list(STALE_CASES))
def test_at_staleness_1_each_batch_records_the_checksum_of_the_weights_that_sampled_it(case, tiny_model_dir,
                                                                                      tiny_data_dir, tmp_path):
    """Batch k + 1 comes from the whole weights after step k; the checksum each rollout rank
    reports (every trainer rank checks it against the whole weights it sent or gathered) is that
    of the trainer's merged checkpoint of that version (version 0: the initial model)."""
    nproc, extra, batches = STALE_CASES[case]
    out = str(tmp_path / case)
    argv = argv_of(tiny_model_dir, tiny_data_dir, out, *STALE, "--save_steps", "1", "--save_total_limit", "10")
    launch(out, argv, nproc, *extra)
    assert_stale_checksums(out, tiny_model_dir)
    assert {rank: generated(out, rank) for rank in batches} == batches


def test_trainer_tp2_beside_one_tp2_replica_is_the_colocated_tp2_run_with_its_sliced_rollout(tiny_model_dir,
                                                                                            tiny_data_dir, tmp_path):
    """The replica's slices, cut from the whole weights by the model's own mappings, are the
    colocated TP2 model's slices: the colocated TP2 run with `rollout_tensor_parallel_degree 2`
    (each rank generating from its own slices) bit for bit, at staleness 0."""
    colocated = str(tmp_path / "colocated_tp2_rtp2")
    launch(colocated, argv_of(tiny_model_dir, tiny_data_dir, colocated, *TP2, *RTP2), 2)
    out = str(tmp_path / "split_tp2_rtp2")
    launch(out, argv_of(tiny_model_dir, tiny_data_dir, out, *TP2), 4, *split_args(2), *RTP2)
    assert_same_run(out, colocated, trainer_ranks=2)
    assert [generated(out, 2), generated(out, 3)] == [STEPS, STEPS]


def test_one_replica_of_tp2_beside_a_tp1_trainer_is_the_colocated_run(tiny_model_dir, tiny_data_dir, tmp_path):
    colocated = str(tmp_path / "colocated")
    build_trainer(argv_of(tiny_model_dir, tiny_data_dir, colocated)).train()
    out = str(tmp_path / "split_1x_rtp2")
    launch(out, argv_of(tiny_model_dir, tiny_data_dir, out), 3, *split_args(2), *RTP2)
    got, want = steps(out), steps(colocated)
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    for a, b in zip(got, want):
        keys = {k for k in b if not k.startswith(NOT_COMPARED)}
        assert keys <= set(a), sorted(keys - set(a))
        far = {k: (a[k], b[k]) for k in keys if abs(a[k] - b[k]) > METRIC_TOL * max(1.0, abs(b[k]))}
        assert not far, (a["step"], far)
    assert samples(out) == samples(colocated)  # the same tokens sampled
    wa, wb = policy_weights(f"{out}/policy"), policy_weights(f"{colocated}/policy")
    assert wa.keys() == wb.keys() and max(float(np.abs(wa[k] - wb[k]).max()) for k in wb) <= WEIGHT_TOL
    assert [r["async/staleness_mean"] for r in got] == [0.0] * STEPS
    for rank in (1, 2):  # both ranks of the replica generate every batch from their slice; rank 1 sends it
        log = open(f"{out}/launch/workerlog.{rank}").read()
        assert f"generating from this rank's tensor-parallel slice ({rank} of 2)" in log
        assert generated(out, rank) == STEPS
    whole = sum(int(p.numel()) * p.element_size() for p in load_causal_lm(tiny_model_dir).parameters())
    for rank in (1, 2):  # each holds half the tensor-parallel weights and the norms whole
        held = json.load(open(f"{out}/rollout_rank_{rank}.json"))
        assert held["sliced"] and held["replica_rank"] == rank - 1 and held["whole_parameter_bytes"] == whole
        assert held["tensor_parallel_bytes"] * 2 == held["whole_tensor_parallel_bytes"]
        assert 0.5 <= held["parameter_bytes"] / whole <= 0.51  # measured 33664 / 66944 = 0.503


def test_trainer_tp2_dp2_beside_two_rollout_ranks_is_the_colocated_tp2_dp2_run(tiny_model_dir, tiny_data_dir, tmp_path):
    colocated = str(tmp_path / "colocated_tp2_dp2")
    launch(colocated, argv_of(tiny_model_dir, tiny_data_dir, colocated, *TP2), 4)
    out = str(tmp_path / "split_tp2_dp2")
    launch(out, argv_of(tiny_model_dir, tiny_data_dir, out, *TP2), 6, *split_args(2))
    assert_same_run(out, colocated, trainer_ranks=4)
    assert [generated(out, 4), generated(out, 5)] == [STEPS, STEPS]  # rollout rank 4 + d serves data rank d
