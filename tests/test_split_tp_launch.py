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
Three or four processes on two cores: slow suite."""
import pytest

from ppo.models.loading import load_causal_lm
from ppo.strategy.rollout_link import weights_checksum
from tests.test_async_launch import STALE, steps
from tests.test_split_many_launch import STEPS, argv_of, assert_same_run, generated
from tests.tp_launch import cold_launch_run

pytestmark = pytest.mark.slow
TP2 = ("--tensor_parallel_degree", "2")


def launch(out, argv, nproc, *split):
    return cold_launch_run("ppo/run_ppo.py", [*argv, *split], out, nproc=nproc, cpu_tp_standins=True)


def split_args(rollout_ranks):
    return ("--rollout_placement", "split", "--rollout_ranks", str(rollout_ranks))


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


def test_trainer_tp2_at_staleness_1_records_the_checksum_of_the_weights_that_sampled_each_batch(
        tiny_model_dir, tiny_data_dir, tmp_path):
    """Batch k + 1 comes from the whole weights after step k; the checksum each replica reports
    (both trainer ranks check it against the whole weights they gathered) is that of the
    trainer's merged checkpoint of that version (version 0: the initial model)."""
    out = str(tmp_path / "stale_tp2")
    argv = argv_of(tiny_model_dir, tiny_data_dir, out, *TP2, *STALE, "--save_steps", "1", "--save_total_limit", "10")
    launch(out, argv, 4, *split_args(2))
    rows = steps(out)
    assert [r["async/weights_version"] for r in rows] == [0, 0, 1]
    assert [r["async/staleness_mean"] for r in rows] == [0.0, 1.0, 1.0]
    for r in rows:
        version = int(r["async/weights_version"])
        path = f"{out}/checkpoint-{version}/policy" if version else tiny_model_dir
        assert r["async/weights_checksum"] == weights_checksum(list(load_causal_lm(path).parameters())), r["step"]
    assert all(abs(r["rollout/logprob_diff_max"]) > 1e-3 for r in rows[1:])  # the stale batches are corrected
    assert [generated(out, 2), generated(out, 3)] == [2, 1]
