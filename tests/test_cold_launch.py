"""Multi-process PPO launched as a user launches it: `python -m paddle.distributed.launch
--nproc_per_node 2 ppo/run_ppo.py config/tiny/ppo_argument.json ...` in fresh processes, for data
parallel, sharding stage 1 and tensor parallel, writes what the warm launch of the same arguments
writes (the path every other multi-process test takes: `tests/tp_launch.launch_run`, whose launcher
and workers are zygote children and whose workers run the script through `tests/tp_entry.py`).

What only the cold launch exercises: the entry script as `__main__` from a fresh interpreter
(its own imports, argument checks and `run_and_exit`'s barrier and exit on every rank), the
launcher started by `python -m`, and the launcher's variables read at import time. Same code,
same seeds and the same two ranks: every logged metric, sample, fingerprint, saved weight and
optimiser state must be equal, bit for bit.

Tensor parallel on CPU processes needs the test-only stand-ins of the GPU collectives
(`tests/tp_cpu_collectives.py`); the cold launch gets them from `tests/cold_launch_site/
sitecustomize.py`, loaded by each worker's interpreter at start-up, so the command is still the
user's. `test_tensor_parallel_needs_the_cpu_standins` shows why they are needed: without them the
same cold launch stops at the first model-parallel all-reduce."""
import json
import os

import numpy as np
import paddle
import pytest

from tests.demo_config_flags import PPO_AS_BEFORE
from tests.test_tensor_parallel import ppo_argv
from tests.tp_launch import cold_launch, cold_launch_run, launch_run, read_jsonl, worker_logs

pytestmark = pytest.mark.slow

VOLATILE = ("timing_s/", "perf/")  # wall-clock measurements, never compared
LAYOUTS = {
    "data_parallel": (),
    "sharding_stage1": ("--sharding", "stage1", "--sharding_parallel_degree", "2"),
    "tensor_parallel": ("--tensor_parallel_degree", "2"),
}


def run_argv(model_dir, rm_dir, data_dir, out, layout):
    """PPO with a reward model and a critic, evaluated and checkpointed at its last step (2)."""
    return ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        model_dir, data_dir, "--reward_model_name_or_path", rm_dir, "--per_device_prompt_batch_size", "8",
        "--per_device_train_batch_size", "4", "--learning_rate", "1e-3", "--critic_learning_rate", "1e-3",
        "--kl_coeff", "0.1", "--entropy_coeff", "0.01", "--save_steps", "2",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", *LAYOUTS[layout],
    )]


def steady(row):
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def tensors(path):
    """The tensors of a `paddle.save`d file, flattened to `{key path: numpy array}` (optimiser
    states nest their accumulators; learning-rate schedulers hold plain numbers)."""
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, paddle.Tensor):
            flat[prefix] = value.numpy()
        elif isinstance(value, np.ndarray):
            flat[prefix] = value
        else:
            flat[prefix] = np.asarray(value)

    walk("", paddle.load(path))
    return flat


def assert_same_file_tensors(warm_path, cold_path):
    warm, cold = tensors(warm_path), tensors(cold_path)
    assert sorted(cold) == sorted(warm), cold_path
    for key in warm:
        np.testing.assert_array_equal(cold[key], warm[key], err_msg=f"{cold_path}: {key}")


def assert_same_outputs(warm, cold):
    """`cold` wrote what `warm` wrote: metrics, samples, summary, weights, optimiser states."""
    warm_rows, cold_rows = ([steady(r) for r in read_jsonl(f"{o}/metrics.jsonl")] for o in (warm, cold))
    assert [r.get("step") for r in cold_rows] == [r.get("step") for r in warm_rows]
    assert sum("loss/policy_avg" in r for r in cold_rows) == 2  # both training steps logged
    for w, c in zip(warm_rows, cold_rows):
        assert sorted(c) == sorted(w), c.get("step")
        for key in w:
            assert c[key] == w[key], (c.get("step"), key, w[key], c[key])
    assert read_jsonl(f"{cold}/samples.jsonl") == read_jsonl(f"{warm}/samples.jsonl")
    s_warm, s_cold = (json.load(open(f"{o}/summary.json")) for o in (warm, cold))
    assert len(s_cold["actor_fingerprints"]) == 2 and s_cold["actor_fingerprints"] == s_warm["actor_fingerprints"]
    assert steady(s_cold["final"]) == steady(s_warm["final"]) and "eval/accuracy" in s_cold["final"]
    for name in ("policy", "value"):
        assert_same_file_tensors(f"{warm}/{name}/model_state.pdparams", f"{cold}/{name}/model_state.pdparams")
    optimiser_files = sorted(f for f in os.listdir(f"{warm}/checkpoint-2") if f.endswith(".pdopt"))
    assert len(optimiser_files) == 4  # policy and value, one per rank
    assert sorted(f for f in os.listdir(f"{cold}/checkpoint-2") if f.endswith(".pdopt")) == optimiser_files
    for name in optimiser_files:
        assert_same_file_tensors(f"{warm}/checkpoint-2/{name}", f"{cold}/checkpoint-2/{name}")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cold_launch_writes_what_the_warm_launch_writes(layout, tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    warm, cold = str(tmp_path / "warm"), str(tmp_path / "cold")
    launch_run("ppo/run_ppo.py", run_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, warm, layout), warm)
    cold_launch_run("ppo/run_ppo.py", run_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, cold, layout), cold,
                    cpu_tp_standins=layout == "tensor_parallel")
    logs = worker_logs(f"{cold}/launch", tail=10**7)
    assert logs.count("--- workerlog.") == 2 and "Traceback" not in logs
    assert_same_outputs(warm, cold)
    if layout == "tensor_parallel":  # each rank held half of every split weight; the saved model is merged
        assert json.load(open(f"{cold}/policy/config.json")).get("tensor_parallel_degree", 1) == 1


def test_tensor_parallel_needs_the_cpu_standins(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """The same cold tensor-parallel launch without the stand-ins fails in Paddle's gloo backend,
    not in this toolkit. If this test fails because the launch succeeded, Paddle's CPU build runs
    tensor parallel by itself and the stand-ins can go."""
    out = str(tmp_path / "bare")
    proc = cold_launch("ppo/run_ppo.py", run_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "tensor_parallel"), out)
    logs = worker_logs(f"{out}/launch", tail=10**7)
    assert proc.returncode != 0
    assert "ProcessGroupGLOO does not support all_reduce with sync_op and use_calc_stream flag" in logs, logs[-3000:]
    assert not os.path.exists(f"{out}/policy")
