"""bench/step_bench.py's own harness: one tiny measured step of each case through the real
trainer (ours only), and the JSON it reports."""
import json
import math
import os
import subprocess
import sys

import pytest

from tests.hf_weights_helpers import hf_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import step_bench  # noqa: E402


def test_bench_reports_our_steps_and_phases(tmp_path):
    out = tmp_path / "bench.json"
    report = step_bench.main(["--small", "--steps", "1", "--no_trl", "--output", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["trl"] == {} and "TRL not run" in report["note"] and "--no_trl" in report["note"]
    assert report["measured_steps"] == 1 and report["new_tokens"] == 4 and report["threads"]["trl"] == report["threads"]["paddle"] >= 1
    for case, rows in (("grpo", 16), ("ppo", 16)):
        ours = report["results"][case]["ours"]
        assert "trl" not in report["results"][case] and "ratio_trl_over_ours" not in report["results"][case]
        assert ours["sequences_per_step"] == rows
        assert ours["response_tokens_per_step"] == rows * 4  # EOS suppressed: every response is 4 tokens
        phases = ours["phases_s_median"]
        assert set(phases) == {"rollout", "logprob", "update"} and all(v > 0 for v in phases.values())
        assert len(ours["step_s_all"]) == 1 and ours["step_s_median"] == ours["step_s_all"][0]
        assert ours["step_s_median"] >= sum(phases.values()) * 0.99  # the phases lie inside the step
        assert math.isfinite(ours["loss_policy_last"])


def test_grpo_and_ppo_arguments_are_the_documented_setups():
    grpo = step_bench.our_argv("grpo", "M", "R", "D", "O")
    value = lambda argv, key: argv[argv.index(key) + 1]  # noqa: E731  (last occurrence is not needed: keys appear once)
    assert value(grpo, "--rollout_n") == "4" and value(grpo, "--per_device_prompt_batch_size") == "4"
    assert value(grpo, "--kl_loss_type") == "k3" and float(value(grpo, "--kl_loss_coeff")) > 0
    assert value(grpo, "--max_dec_len") == value(grpo, "--min_dec_len") == "16"
    ppo = step_bench.our_argv("ppo", "M", "R", "D", "O")
    assert value(ppo, "--update_iters") == "4" and value(ppo, "--per_device_prompt_batch_size") == "16"
    assert value(ppo, "--rollout_n") == "1" and value(ppo, "--per_device_train_batch_size") == "16"


def test_compare_train_patch_runs_both_variants():
    report = step_bench.main(["--small", "--steps", "1", "--no_trl", "--case", "grpo", "--compare_train_patch"])
    result = report["results"]["grpo"]
    assert result["ours_without_train_patch"]["sequences_per_step"] == result["ours"]["sequences_per_step"] == 16
    expected = result["ours_without_train_patch"]["step_s_median"] / result["ours"]["step_s_median"]
    assert abs(result["ratio_train_patch_speedup"] - expected) < 1e-3
    argv = step_bench.our_argv("grpo", "M", "R", "D", "O", train_patch=False)
    assert argv[argv.index("--use_train_patch") + 1] == "false"


def test_our_steps_alternate_with_trls(monkeypatch):
    """Each of our measured steps runs after one of TRL's (a stand-in run here); the ratio is TRL's
    median over ours and the load averages are reported."""
    calls = []
    run = step_bench.OurSteps.run
    monkeypatch.setattr(step_bench.OurSteps, "run", lambda self, n: (calls.append(("ours", n)), run(self, n))[1])
    monkeypatch.setattr(step_bench, "find_trl_python", lambda case, explicit: ("fake-python", "fake trl"))

    def fake_trl(*args, between=None, **kwargs):
        for i in range(3):
            calls.append(("trl", i))
            between(i)
        return {"step_s_median": 2.0, "step_s_all": [2.0, 1.0, 4.0]}

    monkeypatch.setattr(step_bench, "run_trl", fake_trl)
    report = step_bench.main(["--small", "--steps", "3", "--case", "grpo"])
    assert calls == [("trl", 0), ("ours", 1), ("trl", 1), ("ours", 1), ("trl", 2), ("ours", 1), ("ours", 0)]
    result = report["results"]["grpo"]
    ours = result["ours"]["step_s_all"]
    assert len(ours) == 3 and result["trl"]["step_s_median"] == 2.0
    assert abs(result["ratio_trl_over_ours"] - 2.0 / result["ours"]["step_s_median"]) < 1e-2
    paired = sorted(t / o for t, o in zip([2.0, 1.0, 4.0], ours))[1]  # the median of the adjacent steps' ratios
    assert abs(result["ratio_trl_over_ours_paired"] - paired) < 1e-2 * paired
    assert len(result["load_avg_1m"]) == 2 and all(v >= 0 for v in result["load_avg_1m"])
    assert report["trl"] == {"grpo": "fake trl"} and report["note"] is None


FAKE_WORKER = """import json, sys
steps = int(sys.argv[sys.argv.index("--steps") + 1])
assert "--interleave" in sys.argv
print("a log line")
replies = 0
for _ in range(steps + 1):  # the warm-up step, then the measured ones
    print("@@step", flush=True)
    replies += sys.stdin.readline() == "go\\n"
print(json.dumps({"step_s_median": 1.5, "replies": replies}))
"""


def test_run_trl_talks_to_the_worker_step_by_step(monkeypatch, tmp_path):
    """`run_trl` answers each of the worker's step signals after `between` (for the first `steps`
    of them) and returns the worker's last line; a failing worker gives a failure record."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "trl_step_worker.py").write_text(FAKE_WORKER)
    monkeypatch.setattr(step_bench, "ROOT", str(tmp_path))
    seen = []
    result = step_bench.run_trl(sys.executable, "grpo", "M", "D", 4, threads=1, between=seen.append)
    assert result == {"step_s_median": 1.5, "replies": 5} and seen == [0, 1, 2, 3]
    (tmp_path / "bench" / "trl_step_worker.py").write_text("import sys; sys.exit('no trl here')")
    failed = step_bench.run_trl(sys.executable, "grpo", "M", "D", 4, threads=1)
    assert failed["failed"] == "exit status 1" and "no trl here" in failed["stderr_tail"]


def test_arch_runs_the_family_on_our_side():
    report = step_bench.main(["--small", "--steps", "1", "--no_trl", "--case", "grpo", "--arch", "qwen3"])
    assert report["model"]["arch"] == "qwen3" and report["model"]["architecture"] == "Qwen3ForCausalLM"
    assert report["results"]["grpo"]["ours"]["sequences_per_step"] == 16


def test_qwen3_moe_assets_turn_the_router_losses_off_for_both_sides(tmp_path):
    model_dir, _, _ = step_bench.build_assets(str(tmp_path), dict(step_bench.SHAPE, num_layers=2), num_prompts=4,
                                              arch="qwen3_moe")
    config = json.load(open(os.path.join(model_dir, "config.json")))
    assert config["model_type"] == "qwen3_moe" and config["output_router_logits"] is False
    assert config["num_experts"] == 4 and config["mlp_only_layers"] == [0]


@pytest.mark.skipif(hf_python() is None, reason="no Python with torch and transformers (set PADDLE_ALIGN_HF_PYTHON)")
def test_the_trl_worker_builds_the_same_family_and_shape(tmp_path):
    """The worker's transformers model has the family and the parameter count of ours, per arch."""
    from ppo.tiny.factory import build_tiny

    archs = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
    ours = {}
    for arch in archs:
        model = build_tiny(str(tmp_path / arch), seed=7, arch=arch, **dict(step_bench.SHAPE, num_layers=2))[1]
        ours[arch] = sum(int(p.numel()) for p in model.parameters())
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import trl_step_worker as w; "
            "models = {a: w.family_models(w.hf_config(sys.argv[2] + '/' + a))[0] for a in sys.argv[3:]}; "
            "print(json.dumps({a: [type(m).__name__, sum(p.numel() for p in m.parameters())] for a, m in models.items()}))")
    out = subprocess.run([hf_python(), "-c", code, os.path.join(ROOT, "bench"), str(tmp_path), *archs],
                         capture_output=True, text=True, check=True).stdout
    theirs = json.loads(out.strip().splitlines()[-1])
    assert theirs == {arch: [name, ours[arch]] for arch, name in archs.items()}
