"""rollout_placement split as users run it: `paddle.distributed.launch` with two CPU processes
(rank 0 trains, rank 1 generates) against the colocated one-process run of the same tiny GRPO
config: staleness 0 gives its per-step metrics and final weights bit for bit, also as a two-node
launch on one host; staleness 1 generates from exactly the trainer's weights of the version it
records; a rollout rank killed mid-run stops the trainer with a checkpoint (at staleness 1 through
the launcher's repeated SIGTERMs) and the run resumes from it; a run killed with
SIGKILL resumes without losing or repeating a batch. The two-node launch and the SIGKILL resumes
(about 25 s each) are in the slow suite: the default one checks the same schedule from a resumed
step with a recording link (tests/test_async_rollout.py)."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest

from ppo.models.loading import load_causal_lm
from ppo.run_ppo import build_trainer
from ppo.strategy.rollout_link import weights_checksum
from tests.test_reward_server import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 5
NOT_COMPARED = ("timing_s/", "perf/", "async/")  # wall times, and the split run's own counters
STALE = ("--async_staleness", "1", "--rollout_is", "token", "--use_rollout_logprobs", "false")


def run_argv(model_dir, data_dir, out, *extra):
    """A 5-step tiny GRPO run scored in process with graded rewards (the answers of a group differ),
    with a KL loss to the reference (a split run's rollout rank computes the reference log-probs)."""
    return [
        "config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", model_dir,
        "--rule_reward_scorers", "tests.rule_reward_helpers:_char_recall_scorer",
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", str(STEPS), "--per_device_prompt_batch_size", "4",
        "--rollout_n", "4", "--per_device_train_batch_size", "8", "--max_dec_len", "6", "--evaluation_strategy", "no",
        "--save_steps", "0", "--num_sample_generations", "1", "--disable_tqdm", "true", "--learning_rate", "1e-3",
        "--kl_loss_coeff", "0.1", *extra,
    ]


def launch_cmd(out, argv, *launch_flags):
    return [sys.executable, "-m", "paddle.distributed.launch", *launch_flags, "--log_dir", f"{out}/launch",
            "ppo/run_ppo.py", *argv, "--rollout_placement", "split"]


def env():
    return dict(os.environ, MKL_DEBUG_CPU_TYPE="5", PYTHONPATH=REPO)


def logs(out, tail=3000):
    found = []
    for root, _, files in os.walk(out):
        found += [os.path.join(root, f) for f in files if f.startswith("workerlog")]
    return "".join(f"\n--- {f} ---\n" + open(f, errors="replace").read()[-tail:] for f in sorted(found))


def launch(out, argv, nproc=2):
    proc = subprocess.run(launch_cmd(out, argv, "--nproc_per_node", str(nproc)), cwd=REPO, env=env(), capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + logs(out)
    return out


def steps(out):
    return [json.loads(ln) for ln in open(f"{out}/metrics.jsonl") if "objective/scores" in ln]


def complete_steps(out):
    """Step lines fully written so far (the run may be writing the next one)."""
    return sum(1 for ln in open(f"{out}/metrics.jsonl") if "objective/scores" in ln and ln.endswith("\n"))


def policy_weights(path):
    return {k: v.numpy() for k, v in paddle.load(os.path.join(path, "model_state.pdparams")).items()}


def assert_same_run(got, want, count=STEPS):
    """Every compared metric of each of the `count` steps, the samples and the final weights: bit for bit."""
    a, b = steps(got), steps(want)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, count + 1))
    for ra, rb in zip(a, b):
        keys = {k for k in rb if not k.startswith(NOT_COMPARED)}
        assert {k: ra[k] for k in keys} == {k: rb[k] for k in keys}, ra["step"]
    samples = lambda out: [(s["step"], s["prompt"], s["response"], s["score"])  # noqa: E731
                           for s in map(json.loads, open(f"{out}/samples.jsonl"))]
    assert samples(got) == samples(want)
    wa, wb = policy_weights(f"{got}/policy"), policy_weights(f"{want}/policy")
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wb)


@pytest.fixture(scope="module")
def colocated(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """The colocated one-process run (today's behaviour)."""
    out = str(tmp_path_factory.mktemp("colocated"))
    build_trainer(run_argv(tiny_model_dir, tiny_data_dir, out)).train()
    return out


@pytest.fixture(scope="module")
def split(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("split"))
    return launch(out, run_argv(tiny_model_dir, tiny_data_dir, out))


@pytest.mark.slow
def test_split_staleness_0_is_the_colocated_run(split, colocated):
    assert_same_run(split, colocated)
    rows = steps(split)
    assert [r["async/staleness_mean"] for r in rows] == [0.0] * STEPS
    assert [r["async/weights_version"] for r in rows] == list(range(STEPS))
    assert all(r["async/rollout_wait_s"] >= 0 and r["async/weights_sync_s"] >= 0 for r in rows)
    kl = [r["objective/kl"] for r in rows]  # from the rollout rank's reference log-probs: 0 until the policy moves
    assert abs(kl[0]) < 1e-6 < min(kl[1:]), kl
    fingerprints = json.load(open(f"{split}/summary.json"))["actor_fingerprints"]
    assert fingerprints == json.load(open(f"{colocated}/summary.json"))["actor_fingerprints"] and len(fingerprints) == 1


@pytest.mark.slow
def test_two_node_launch_is_the_one_launch_run(split, tiny_model_dir, tiny_data_dir, tmp_path):
    """`--nnodes 2 --master 127.0.0.1:PORT --rank {0,1}`: one launch per rank, as on two machines."""
    out, port = str(tmp_path / "two_nodes"), free_port()
    argv = run_argv(tiny_model_dir, tiny_data_dir, out)
    procs = [subprocess.Popen(launch_cmd(f"{out}/node{rank}", argv, "--nnodes", "2", "--master", f"127.0.0.1:{port}",
                                         "--rank", str(rank)), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [p.communicate()[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-2000:] + logs(out)
    assert_same_run(out, split)


@pytest.mark.slow
def test_stale_batches_use_exactly_the_trainers_weights_of_their_version(tiny_model_dir, tiny_data_dir, tmp_path):
    """Staleness 1, a checkpoint after every step: the weights that sampled each batch (their
    checksum, reported by the rollout rank after applying them) are the trainer's after the
    step of that version (checkpoint-<v>/policy; version 0: the initial model)."""
    out = str(tmp_path / "stale")
    launch(out, run_argv(tiny_model_dir, tiny_data_dir, out, *STALE, "--save_steps", "1", "--save_total_limit", "10"))
    rows = steps(out)
    assert [r["async/weights_version"] for r in rows] == [0, 0, 1, 2, 3]  # batch k + 1 from the weights after step k
    assert [r["async/staleness_mean"] for r in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]
    for r in rows:
        version = int(r["async/weights_version"])
        path = f"{out}/checkpoint-{version}/policy" if version else tiny_model_dir
        assert r["async/weights_checksum"] == weights_checksum(list(load_causal_lm(path).parameters())), r["step"]
    # the stale batches are corrected: weights differ from 1 exactly where the sampling weights were older
    assert rows[0]["rollout/is_weight_max"] == pytest.approx(1.0, abs=1e-5)
    assert all(abs(r["rollout/logprob_diff_max"]) > 1e-3 for r in rows[1:])


def workers(proc):
    """The launch's worker processes (each leads a session of its own: `paddle.distributed.launch` setsid's them)."""
    return [int(pid) for pid in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]


def wait_for(predicate, proc, out):
    while not predicate():
        assert proc.poll() is None, "the run ended before the kill: " + logs(out)
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("stale", [False, True])
def test_a_dead_rollout_rank_stops_the_trainer_with_a_checkpoint(stale, tiny_model_dir, tiny_data_dir, tmp_path):
    """The rollout rank killed after step 2: the trainer saves its last completed step and names the
    lost rank. At staleness 1 the trainer is usually training when the rank dies, so the launcher's
    SIGTERMs (up to three, 0.2 s apart) reach it first: they are one stop request, the step ends,
    is saved, and the check of the rollout rank names it. The same command resumes from that
    checkpoint without repeating a step."""
    out = str(tmp_path / "dead")
    slow_update = ("--update_iters", "12")  # a trainer step of about 2 s: the launcher's SIGTERMs arrive while it trains
    argv = run_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "400", "--overwrite_output_dir", "false",
                    *(STALE + slow_update if stale else ()))
    proc = subprocess.Popen(launch_cmd(out, argv, "--nproc_per_node", "2"), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: os.path.exists(f"{out}/metrics.jsonl") and complete_steps(out) >= 2, proc, out)
    rollout_rank = [pid for pid in workers(proc) if "PADDLE_TRAINER_ID=1" in open(f"/proc/{pid}/environ").read().split("\0")]
    os.kill(rollout_rank[0], signal.SIGKILL)
    proc.communicate()
    assert proc.returncode != 0
    trainer_log = open(f"{out}/launch/workerlog.0").read()
    saved = [d for d in os.listdir(out) if d.startswith("checkpoint-")]
    assert len(saved) == 1 and os.path.exists(f"{out}/{saved[0]}/trainer_state.json"), trainer_log[-3000:]
    step = int(saved[0].split("-")[1])
    assert step >= 2 and len(steps(out)) == step
    assert (f"RolloutRankLost: the rollout rank (rank 1) of this rollout_placement split run stopped answering" in trainer_log
            and f"saved {out}/checkpoint-{step} (after step {step}) before stopping" in trainer_log), trainer_log[-3000:]
    assert "KeyboardInterrupt" not in trainer_log and "stopping at once" not in trainer_log
    i = len(argv) - 1 - argv[::-1].index("--max_steps")
    launch(out, argv[:i + 1] + [str(step + 1)] + argv[i + 2:])  # the same command, one step further
    assert [r["step"] for r in steps(out)] == list(range(1, step + 2))  # nothing lost, nothing repeated


@pytest.mark.slow
@pytest.mark.parametrize("stale", [False, True])
def test_resume_after_sigkill_loses_and_repeats_no_batch(stale, colocated, tiny_model_dir, tiny_data_dir, tmp_path):
    """Every process killed with SIGKILL after checkpoint-2, then the same command again: steps 1..5
    once each, the batches of the colocated run's prompts in its order; staleness 0 is the
    uninterrupted run bit for bit, staleness 1 regenerates the batches after the checkpoint from
    its weights (batch 2 from version 2: staleness 0)."""
    out = str(tmp_path / "killed")
    argv = run_argv(tiny_model_dir, tiny_data_dir, out, "--save_steps", "2", "--overwrite_output_dir", "false",
                    *(STALE if stale else ()))
    proc = subprocess.Popen(launch_cmd(out, argv, "--nproc_per_node", "2"), cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_for(lambda: os.path.exists(f"{out}/checkpoint-2/trainer_state.json"), proc, out)
    for pid in workers(proc):  # every process at once, as a machine that loses power
        os.killpg(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    assert not os.path.exists(f"{out}/summary.json")  # killed before the end
    launch(out, argv)
    rows = steps(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    prompts = lambda o: [(s["step"], s["prompt"]) for s in map(json.loads, open(f"{o}/samples.jsonl"))]  # noqa: E731
    assert prompts(out) == prompts(colocated)
    if not stale:
        assert_same_run(out, colocated)
    else:  # resumed at K (2, or 4 when that checkpoint beat the kill): batch K from version K again
        resumed = next(r["step"] - 1 for r in rows[1:] if r["async/staleness_mean"] == 0.0)
        assert resumed in (2, 4)
        expected = [max(0, b - 1) for b in range(resumed)] + [max(resumed, b - 1) for b in range(resumed, STEPS)]
        assert [r["async/weights_version"] for r in rows] == expected


@pytest.mark.slow
def test_partial_rollout_responses_span_an_update(tiny_model_dir, tiny_data_dir, tmp_path):
    """`partial_rollout` at staleness 1, 2 tokens before the update: from step 2 on, responses
    longer than 2 tokens carry two versions (k - 1 then k, the trainer's weights of this step),
    every token is at most 1 step stale, and the correction weights each token by its own
    sampling log-prob: 1 on the tokens of the trainer's own version, not 1 on the older ones."""
    out = str(tmp_path / "partial")
    launch(out, run_argv(tiny_model_dir, tiny_data_dir, out, *STALE, "--partial_rollout", "true",
                         "--partial_rollout_tokens", "2", "--sample_token_details", "true"))
    rows = steps(out)
    assert [r["async/weights_version"] for r in rows] == [0, 0, 1, 2, 3]  # the oldest token's version
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert all(0.0 < r["async/staleness_mean"] < 1.0 for r in rows[1:]), [r["async/staleness_mean"] for r in rows]
    assert_tokens_span_the_update(out)


def assert_tokens_span_the_update(out):
    """`samples.jsonl` of a partial run with 2 tokens before the update: from step 2 on a response's
    first 2 tokens are version k - 1 and the rest version k, every token at most 1 step stale, the
    tokens of version k weighted 1 and some older ones not."""
    samples = [s for s in map(json.loads, open(f"{out}/samples.jsonl")) if s["step"] >= 2]
    spanning, old_weights = 0, []
    for s in samples:
        k, versions, weights = s["step"] - 1, s["token_versions"], s["rollout_is_weights"]
        assert versions[:2] == [k - 1] * min(2, len(versions)) and set(versions[2:]) <= {k}, s
        assert all(0 <= k - v <= 1 for v in versions), s  # the staleness bound, per token
        spanning += len(versions) > 2
        for v, w in zip(versions, weights):
            if v == k:
                assert w == pytest.approx(1.0, abs=2e-4), s
            else:
                old_weights.append(w)
    assert spanning > 0 and max(abs(w - 1.0) for w in old_weights) > 1e-3
