"""bench/step_bench.py drives the real trainer: one GRPO and one PPO step on a shrunken shape
give a report whose step time covers its phases (the numbers themselves come from running the
bench, not from here)."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("step_bench", os.path.join(ROOT, "bench", "step_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.SHAPE = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2)  # fast
    return module


def test_report_has_both_cases_with_phases_inside_the_step(bench):
    report = bench.main(["--steps", "2", "--warmup", "0", "--compare_train_patch"])
    assert set(report["results"]) == {"grpo", "ppo"} and report["new_tokens"] == 16
    for case, result in report["results"].items():
        ours = result["ours"]
        phases = ours["median_phase_s"]
        assert set(phases) == {"rollout", "logprob", "update"} and all(v > 0 for v in phases.values())
        assert ours["steps"] == 2 and ours["median_step_s"] >= 0.9 * sum(phases.values()), (case, ours)
        assert result["ratio_train_patch_speedup"] > 0 and result["ours_without_train_patch"]["steps"] == 2
    assert report["results"]["ppo"]["case"]["epochs"] == 4 and report["results"]["grpo"]["case"]["samples"] == 4
