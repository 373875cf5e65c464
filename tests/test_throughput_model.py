"""The split-run schedule model (scripts/split_sim.py) against step times derived by hand from the
schedule of ppo.trainer.remote_rollout / rollout_worker, and the GPU cost model's arithmetic
(scripts/throughput_model.py)."""
import math
import os
import re

import pytest

from scripts.split_sim import SplitRun, simulate
from scripts.sizing import MODELS
from scripts.throughput_model import (LONG_REASONING, Workload, _weights_read, fits_training, generate_seconds, gpu_table, live_fraction,
                                      measured_components, rows_per_wave, train_seconds, validate)

GEN, TRAIN, SYNC, STEPS = 1.0, 0.6, 0.1, 20


def total(trainers, replicas, staleness, cores=math.inf, gen=GEN, train=TRAIN):
    return simulate(SplitRun(trainers, replicas, staleness, STEPS, gen, train, SYNC, cores=cores))["total_s"]


def test_synchronous_runs_add_generation_training_and_the_broadcast():
    """Staleness 0: every step waits for its batch, trains, then sends the next weights; one
    replica serving two trainer ranks generates both of their batches each step, and two
    replicas serving one trainer take turns (one idle each step)."""
    assert total(1, 1, 0) == pytest.approx(STEPS * (GEN + TRAIN + SYNC))
    assert total(2, 2, 0) == pytest.approx(STEPS * (GEN + TRAIN + SYNC))
    assert total(2, 1, 0) == pytest.approx(STEPS * (2 * GEN + TRAIN + SYNC))
    assert total(1, 2, 0) == pytest.approx(STEPS * (GEN + TRAIN + SYNC))


def test_one_step_off_policy_overlaps_generation_with_training():
    """Staleness 1, generation the longer: batch 0 after the first broadcast, batch 1 right after
    it, then a batch every generation + broadcast (the broadcast holds both sides); the run ends
    with the last step's training. Training the longer: a step every training + broadcast."""
    generation_bound = SYNC + 2 * GEN + (STEPS - 2) * (GEN + SYNC) + TRAIN
    assert total(1, 1, 1) == pytest.approx(generation_bound)
    assert total(2, 2, 1) == pytest.approx(generation_bound)
    slow_train = 1.5
    training_bound = SYNC + GEN + STEPS * slow_train + (STEPS - 2) * SYNC
    assert total(1, 1, 1, train=slow_train) == pytest.approx(training_bound)


def test_shared_cores_slow_down_what_runs_at_once():
    """On one core a synchronous 1+1 run only shares the broadcast (both sides at half speed);
    four single-thread processes on two cores overlap less than on four; another job's busy
    thread takes its share."""
    assert total(1, 1, 0, cores=1) == pytest.approx(STEPS * (GEN + TRAIN + 2 * SYNC))
    assert total(2, 2, 1, cores=2) > total(2, 2, 1) * 1.3
    assert total(2, 2, 1, cores=4) == pytest.approx(total(2, 2, 1))
    # one busy thread of another job on the one core halves a lone process, a third for two
    busy = simulate(SplitRun(1, 1, 0, STEPS, GEN, TRAIN, SYNC, cores=1, background=1))["total_s"]
    assert busy == pytest.approx(STEPS * (2 * GEN + 2 * TRAIN + 3 * SYNC))


def test_more_replicas_than_trainers_gain_little_when_every_broadcast_meets_all_replicas():
    """Every replica takes every weights version (a collective of all of them), so at staleness 2
    a second replica for one trainer still waits for the first at each broadcast."""
    assert total(1, 2, 2) > 0.9 * total(1, 1, 2)


def test_live_fraction_has_the_workload_mean_and_ends_at_the_longest():
    work = Workload(response_len=1024, response_max=4096)
    mean = sum(live_fraction(work, step) for step in range(work.response_max))
    assert mean == pytest.approx(work.response_len, rel=2e-3)
    assert live_fraction(work, 0) == 1.0 and live_fraction(work, work.response_max) == 0.0


def test_gpu_costs_scale_as_stated():
    work = Workload()
    assert train_seconds("Qwen2.5-7B", work, 16) == pytest.approx(train_seconds("Qwen2.5-7B", work, 8) / 2)
    # decode reads the weights every step: half the rows cost more than half the time
    full, half = (generate_seconds("Qwen2.5-7B", work, rows, 1) for rows in (128, 64))
    assert half / full > 0.5
    # a mixture of experts reaches fewer experts with fewer rows
    moe, dense = MODELS["Qwen3-30B-A3B"], MODELS["Qwen2.5-7B"]
    assert _weights_read(moe, 8) < 0.6 * _weights_read(moe, 512) and _weights_read(dense, 8) == _weights_read(dense, 512)
    # the static KV cache: Llama-2-7B's 32 key-value heads leave room for far fewer rows than Qwen2.5-7B's 4
    assert rows_per_wave("Llama-2-7B", 1024, 4096, 1) * 5 < rows_per_wave("Qwen2.5-7B", 1024, 4096, 1)
    assert not fits_training("Llama-2-70B", 8) and fits_training("Llama-2-70B", 32)
    rows = gpu_table().splitlines()[2:]
    assert len(rows) == 6 and all(row.endswith("x |") for row in rows)


def _bench_from_model(cores):
    """A bench JSON whose 'measured' runs are the model's own: validation must return ratio 1."""
    runs = {}
    for layout in ("1+1", "2+2", "2+1"):
        for staleness in (0, 1):
            n, m = map(int, layout.split("+"))
            sim = simulate(SplitRun(n, m, staleness, STEPS, GEN, TRAIN, SYNC, cores=cores))
            runs[f"{layout}_s{staleness}_seed42"] = {"steps": STEPS, "steps_per_s": sim["steps_per_s"],
                                                     "rollout_wait_s": GEN, "weights_sync_s": SYNC}
    return {"setup": {"cpu_count": cores, "threads_per_process": 1, "seeds": [42]}, "runs": runs}


def test_validation_predicts_each_run_from_the_synchronous_1_plus_1_components():
    report = validate(_bench_from_model(cores=2))
    gen, train, sync = report["components_s"].values()
    assert (gen, sync) == (GEN, SYNC) and train == pytest.approx(TRAIN)
    assert len(report["runs"]) == 6
    for row in report["runs"]:
        assert row["predicted_over_measured"] == pytest.approx(1.0, rel=0.02), row


def test_measured_components_invert_a_synchronous_step():
    run = {"steps_per_s": 1 / (GEN + TRAIN + SYNC), "rollout_wait_s": GEN, "weights_sync_s": SYNC}
    assert measured_components(run) == pytest.approx((GEN, TRAIN, SYNC))


def test_the_docs_table_is_the_scripts_output():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "throughput_model.md")
    block = re.search(r"<!-- THROUGHPUT:BEGIN -->\n(.*?)\n<!-- THROUGHPUT:END -->", open(path).read(), re.S)
    assert block and block.group(1).strip() == gpu_table().strip(), "run: python scripts/throughput_model.py, paste"


def test_the_long_reasoning_range_the_docs_state():
    """docs/throughput_model.md: with long reasoning responses staleness 1 reaches 0.37-0.81x colocated."""
    ratios = [float(row.split("|")[-2].strip()[:-1]) for row in gpu_table(LONG_REASONING).splitlines()[2:]]
    assert (min(ratios), max(ratios)) == (0.37, 0.81)
