"""Multi-turn GRPO under tensor and pipeline parallel on two CPU processes
(`paddle.distributed.launch`, the CPU stand-ins of the collectives): the group's first rank
alone runs the environments, and the run's trajectories are the one-process run's."""
import json
from collections import Counter
from types import SimpleNamespace

import pytest

from ppo.entry.ppo_argument_checks import agent_run_problems
from ppo.run_ppo import main as run_ppo
from tests.test_agent_training import grpo_agent_argv
from tests.tp_launch import launch_run, step_values

COUNTS = ("agent/turns_mean", "agent/tool_calls_mean", "tool/echo/calls", "agent/env_reward_mean", "response_length/mean",
          "objective/scores")
LAYOUTS = {
    "tp2_gathered": ["--tensor_parallel_degree", "2", "--eval_mode", "single"],
    "tp2_sharded": ["--tensor_parallel_degree", "2", "--eval_mode", "tensor_parallel"],
    "pp2": ["--pipeline_parallel_degree", "2", "--pipeline_parallel_config", "disable_p2p_cache_shape"],
}


def counting_argv(model_dir, data_dir, out, log):
    env = json.dumps({"log": log, "turns": 3})
    return grpo_agent_argv(model_dir, data_dir, out, "--env_name", "tests.agent_parallel_helpers:CountingEchoEnv", "--env_kwargs", env,
                           "--max_steps", "2")


@pytest.fixture(scope="module")
def one_process_run(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("agent_tp1")
    out = str(root / "tp1")
    run_ppo(counting_argv(tiny_model_dir, tiny_data_dir, out, str(root / "tp1.log")))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_process_multi_turn_grpo_runs_the_environments_once(tiny_model_dir, tiny_data_dir, tmp_path, one_process_run,
                                                                layout):
    """Each trajectory's environment is built, reset and stepped on one process only (16
    resets for 2 steps of 8 trajectories, one step per policy turn); step 1's trajectories (every
    count, and their scores) are the one-process run's; step 2 trained on them."""
    out, log = str(tmp_path / layout), str(tmp_path / f"{layout}.log")
    launch_run("ppo/run_ppo.py", [*counting_argv(tiny_model_dir, tiny_data_dir, out, log), *LAYOUTS[layout]], out)
    lines = [line.split() for line in open(log)]
    resets = Counter(pid for pid, what in lines if what == "reset")
    # 16 trajectories, and the start-up check's 8 longest prompts (ppo/agents/prompt_room.py), on rank 0
    assert len(resets) == 1 and sum(resets.values()) == 16 + 8
    assert {pid for pid, _ in lines} == set(resets)
    for key in COUNTS:
        v1, v2 = step_values(one_process_run, key), step_values(out, key)
        assert sorted(v2) == [1, 2] and v2[1] == pytest.approx(v1[1], rel=1e-5), key
    assert step_values(out, "tool/echo/calls") == {1: 16.0, 2: 16.0}
    assert sum(1 for _, what in lines if what == "step") == sum(step_values(out, "agent/turns_mean").values()) * 8


def test_tensor_with_pipeline_parallel_multi_turn_is_refused_with_its_reason():
    """Tensor or pipeline parallel alone is no longer refused with env_name; both together are."""
    data = SimpleNamespace(eval_datasets="")
    args = SimpleNamespace(env_name="tools", use_fusemt=True, tensor_parallel_degree=2, pipeline_parallel_degree=1)
    assert agent_run_problems(data, args) == []
    args.tensor_parallel_degree, args.pipeline_parallel_degree = 1, 2
    assert agent_run_problems(data, args) == []
    args.tensor_parallel_degree = 2
    (problem,) = agent_run_problems(data, args)
    assert problem.startswith("env_name with tensor_parallel_degree 2 and pipeline_parallel_degree 2: a multi-turn rollout")
