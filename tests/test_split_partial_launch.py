"""Partial rollouts (`partial_rollout true`) beside several trainer and rollout ranks, as users run
them: cold `paddle.distributed.launch`es of CPU processes, the tiny GRPO config of
tests/test_split_many_launch.py (3 steps, `max_dec_len` 6) at staleness 1 with 2 tokens before the
update and `sample_token_details` (each logged response's token versions and importance weights).

- 2 trainer + 2 rollout ranks (per_device_prompt_batch_size 2, one update batch of 8 rows per
  trainer rank): from step 2 on, responses longer than 2 tokens carry versions k - 1 then k (the
  trainer's weights of step k); no token is over 1 step stale; the correction weighs each token by
  its own sampling log-prob (1 on version k's tokens). A second launch gives the same metrics
  (the `async/` staleness, versions and checksums included), samples and final weights bit for bit.
- The same global batch on 1 trainer + 1 rollout rank (per_device_prompt_batch_size 4, one update
  batch of 16 rows): the same token versions, the same responses (rank 0's logged rows are the
  first rows of each step's) and every compared metric within rtol 2e-5 / atol 1e-6, the final
  weights within 2e-5, the tolerances of the data-parallel tests (tests/test_data_parallel.py):
  two ranks sum the update's gradients and token counts in another order than one process does.
- 2 trainer + 1 rollout rank: the rollout rank generates both trainer ranks' units of a step
  together (first chunks, the update once, the rest), so it is the 2 + 2 run bit for bit.
- Trainer TP1 beside one rollout replica of TP2 (3 processes): the 1 + 1 partial run within
  1e-6 x max(1, |value|), as that layout without partial rollouts (tests/test_split_tp_launch.py).
- Trainer TP2 beside 2 rollout ranks (4 processes), partial: a two-node launch (`--nnodes 2` on
  127.0.0.1: node 0 the trainer's tensor-parallel group, node 1 the rollout ranks) is the one-node
  launch bit for bit, and its responses span the update as above.
Two to four processes per launch on two cores: slow suite."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.test_async_launch import NOT_COMPARED, STALE, assert_tokens_span_the_update, logs, policy_weights, steps
from tests.test_async_launch import assert_same_run as assert_same_async_run
from tests.test_reward_server import free_port
from tests.test_split_many_launch import STEPS, argv_of, generated, launch
from tests.tp_launch import cold_launch_env, cold_launch_run

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTIAL = (*STALE, "--partial_rollout", "true", "--partial_rollout_tokens", "2", "--sample_token_details", "true")
RTOL, ATOL, WEIGHT_ATOL = 2e-5, 1e-6, 2e-5  # tests/test_data_parallel.py's (LOSS_RTOL, WEIGHT_ATOL)
SPLIT_TOKEN_METRICS = ("async/staleness_max", "async/weights_version", "async/weights_checksum")
PER_RANK_COUNTS = ("grpo/groups_per_rank", "val/num_eos_tokens")  # each rank's count, averaged over the ranks
# each rank's mean over its own tokens, averaged over the ranks (whose token counts differ): not the
# one process's mean over all tokens (measured up to 3% apart: val/ratio_var; async/staleness_mean 1.1e-4)
RANK_MEANS = ("async/staleness_mean", "async/fresh_token_frac", "rollout/is_weight_mean", "rollout/logprob_diff_mean",
              "val/ratio", "val/ratio_var")


def partial_argv(model_dir, data_dir, out, prompts, rows, *extra):
    """The tiny GRPO run with partial rollouts, `prompts` prompts and one update batch of `rows` rows per trainer rank."""
    return argv_of(model_dir, data_dir, out, *PARTIAL, "--per_device_prompt_batch_size", str(prompts),
                   "--per_device_train_batch_size", str(rows), *extra)


def samples(out):
    return [json.loads(ln) for ln in open(f"{out}/samples.jsonl")]


def assert_responses_span_the_update(out):
    """Steps >= 2: a response's first 2 tokens are version k - 1, the rest version k (trained at
    step k + 1, `step` in the files); tokens of version k have importance weight 1, the older ones
    not all; the oldest token 1 step stale."""
    rows = steps(out)
    assert [r["async/weights_version"] for r in rows] == [0, 0, 1]  # the oldest token's version
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(0.0 < r["async/staleness_mean"] < 1.0 for r in rows[1:]), [r["async/staleness_mean"] for r in rows]
    assert_tokens_span_the_update(out)


def assert_bit_for_bit(got, want):
    """`tests/test_async_launch.assert_same_run`, plus the split run's per-token staleness, versions and checksums."""
    assert_same_async_run(got, want, STEPS)
    for a, b in zip(steps(got), steps(want)):
        assert {k: a[k] for k in SPLIT_TOKEN_METRICS + ("async/staleness_mean", "async/fresh_token_frac")} == \
               {k: b[k] for k in SPLIT_TOKEN_METRICS + ("async/staleness_mean", "async/fresh_token_frac")}, a["step"]
    assert samples(got) == samples(want)  # token versions and importance weights included
    assert json.load(open(f"{got}/summary.json"))["actor_fingerprints"] == \
           json.load(open(f"{want}/summary.json"))["actor_fingerprints"]


@pytest.fixture(scope="module")
def partial_2x2(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("partial_2x2"))
    return launch(out, partial_argv(tiny_model_dir, tiny_data_dir, out, 2, 8), 4, rollout_ranks=2)


def test_two_by_two_responses_span_an_update(partial_2x2):
    assert_responses_span_the_update(partial_2x2)
    assert [generated(partial_2x2, 2), generated(partial_2x2, 3)] == [STEPS, STEPS]  # rank 2 + t serves trainer t


def test_two_by_two_is_reproducible_bit_for_bit(partial_2x2, tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "again")
    launch(out, partial_argv(tiny_model_dir, tiny_data_dir, out, 2, 8), 4, rollout_ranks=2)
    assert_bit_for_bit(out, partial_2x2)


def test_two_by_two_is_the_one_by_one_partial_run_of_the_same_global_batch(partial_2x2, tiny_model_dir, tiny_data_dir,
                                                                           tmp_path):
    one = str(tmp_path / "partial_1x1")
    launch(one, partial_argv(tiny_model_dir, tiny_data_dir, one, 4, 16), 2, rollout_ranks=1)
    a, b = steps(partial_2x2), steps(one)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        keys = sorted(k for k in rb if not k.startswith(NOT_COMPARED) and k not in PER_RANK_COUNTS + RANK_MEANS)
        assert set(keys) <= set(ra), sorted(set(keys) - set(ra))
        np.testing.assert_allclose([ra[k] for k in keys], [rb[k] for k in keys], rtol=RTOL, atol=ATOL, err_msg=str(keys))
        assert [ra[k] for k in SPLIT_TOKEN_METRICS[:2]] == [rb[k] for k in SPLIT_TOKEN_METRICS[:2]], ra["step"]
        # the checksum of weights after an update is as near as the weights are (version 0: the same model)
        np.testing.assert_allclose(ra["async/weights_checksum"], rb["async/weights_checksum"], rtol=RTOL)
        assert [2 * ra[k] for k in PER_RANK_COUNTS] == [rb[k] for k in PER_RANK_COUNTS], ra["step"]
    by_step = {}
    for s in samples(one):
        by_step.setdefault(s["step"], []).append(s)
    for step, rows in sorted({s["step"]: [] for s in samples(partial_2x2)}.items()):
        got = [s for s in samples(partial_2x2) if s["step"] == step]
        want = by_step[step][:len(got)]
        assert [(s["prompt"], s["response"], s["token_versions"]) for s in got] == \
               [(s["prompt"], s["response"], s["token_versions"]) for s in want], step
        np.testing.assert_allclose(sum((s["rollout_is_weights"] for s in got), []),
                                   sum((s["rollout_is_weights"] for s in want), []), rtol=RTOL, atol=ATOL)
    wa, wb = policy_weights(f"{partial_2x2}/policy"), policy_weights(f"{one}/policy")
    assert wa.keys() == wb.keys() and max(float(np.abs(wa[k] - wb[k]).max()) for k in wb) <= WEIGHT_ATOL


TP2_SPLIT = ("--tensor_parallel_degree", "2", "--rollout_placement", "split", "--rollout_ranks", "2")


def test_two_node_launch_of_trainer_tp2_and_two_rollout_ranks_is_the_one_node_launch(tiny_model_dir, tiny_data_dir,
                                                                                     tmp_path):
    one_node = str(tmp_path / "one_node")
    cold_launch_run("ppo/run_ppo.py", [*partial_argv(tiny_model_dir, tiny_data_dir, one_node, 4, 8), *TP2_SPLIT],
                    one_node, nproc=4, cpu_tp_standins=True)
    assert_responses_span_the_update(one_node)
    out, port = str(tmp_path / "two_nodes"), free_port()
    argv = [*partial_argv(tiny_model_dir, tiny_data_dir, out, 4, 8), *TP2_SPLIT]
    procs = [subprocess.Popen([sys.executable, "-m", "paddle.distributed.launch", "--nnodes", "2", "--nproc_per_node", "2",
                               "--master", f"127.0.0.1:{port}", "--rank", str(node), "--log_dir", f"{out}/node{node}",
                               "ppo/run_ppo.py", *argv], cwd=REPO, env=cold_launch_env(True), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outputs = [p.communicate()[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-2000:] + logs(out)
    assert_bit_for_bit(out, one_node)
    assert sum("rollout rank: generated" in open(f"{out}/node1/workerlog.{i}").read() for i in (0, 1)) == 2


def test_two_trainer_ranks_beside_one_rollout_rank_are_the_two_by_two_run(partial_2x2, tiny_model_dir, tiny_data_dir,
                                                                          tmp_path):
    """The one rollout rank holds both trainer ranks' units of a step: it generates their first
    chunks, takes the update once, then finishes both, so each spans the update as on its own
    rollout rank: the 2 + 2 run bit for bit."""
    out = str(tmp_path / "partial_2x1")
    launch(out, partial_argv(tiny_model_dir, tiny_data_dir, out, 2, 8), 3, rollout_ranks=1)
    assert_bit_for_bit(out, partial_2x2)
    assert generated(out, 2) == 2 * STEPS


def test_one_tp2_replica_beside_a_tp1_trainer_is_the_one_by_one_partial_run(tiny_model_dir, tiny_data_dir, tmp_path):
    """Both ranks of the replica take the update between the chunks and generate the rest from
    their slices of the new weights: the 1 + 1 partial run's samples and token versions, every
    metric within 1e-6 x max(1, |value|) and the final weights within 1e-6 (measured 4.8e-7 and
    6.0e-8; the replica all-reduces its slices' partial sums, as in tests/test_split_tp_launch.py)."""
    one = str(tmp_path / "partial_1x1")
    launch(one, partial_argv(tiny_model_dir, tiny_data_dir, one, 4, 16), 2, rollout_ranks=1)
    out = str(tmp_path / "partial_1x_rtp2")
    cold_launch_run("ppo/run_ppo.py", [*partial_argv(tiny_model_dir, tiny_data_dir, out, 4, 16), "--rollout_placement",
                                       "split", "--rollout_ranks", "2", "--rollout_tensor_parallel_degree", "2"],
                    out, nproc=3)
    assert_responses_span_the_update(out)
    a, b = steps(out), steps(one)
    for ra, rb in zip(a, b):
        keys = sorted(k for k in rb if not k.startswith(NOT_COMPARED))
        far = {k: (ra[k], rb[k]) for k in keys if abs(ra[k] - rb[k]) > 1e-6 * max(1.0, abs(rb[k]))}
        assert not far, (ra["step"], far)
    assert [(s["prompt"], s["response"], s["token_versions"]) for s in samples(out)] == \
           [(s["prompt"], s["response"], s["token_versions"]) for s in samples(one)]
    wa, wb = policy_weights(f"{out}/policy"), policy_weights(f"{one}/policy")
    assert wa.keys() == wb.keys() and max(float(np.abs(wa[k] - wb[k]).max()) for k in wb) <= 1e-6
    for rank in (1, 2):
        assert f"tensor-parallel slice ({rank} of 2)" in open(f"{out}/launch/workerlog.{rank}").read()
