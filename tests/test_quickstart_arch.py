"""`scripts/quickstart.py --arch`: the argument, the per-family output root, the family's flags on each
stage's command, and the base model the build stage writes (without running the training stages)."""
import json
import os
import subprocess
import sys

import pytest

from scripts import quickstart, quickstart_arch
from ppo.tiny.factory import ARCHS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stages_by_name(*args, **kwargs):
    return {s.name: s for s in quickstart.pipeline_stages(*args, **kwargs)}


def test_a_bad_arch_is_one_line_before_anything_is_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(quickstart, "ROOT", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        quickstart.main(["--arch", "qwen4"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("[quickstart] --arch 'qwen4' is not a tiny model family; choose one of: "
                                       + ", ".join(ARCHS) + "\n")
    with pytest.raises(SystemExit) as exit_:
        quickstart.main(["--arch", "qwen3", "--safe"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("[quickstart] --arch qwen3 runs the main pipeline only; --agent and --safe "
                                       "build their own tiny Llama\n")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, root, arch", [
    ([], "outputs/tiny", "llama"),
    (["--seed", "43"], "outputs/tiny-seed43", "llama"),
    (["--arch", "qwen3"], "outputs/tiny-qwen3", "qwen3"),
    (["--arch", "qwen3_moe", "--seed", "43"], "outputs/tiny-qwen3_moe-seed43", "qwen3_moe"),
    (["--arch", "ernie45", "--output_root", "elsewhere"], "elsewhere", "ernie45"),
])
def test_each_family_runs_in_its_own_output_root(tmp_path, monkeypatch, argv, root, arch):
    calls = []
    monkeypatch.setattr(quickstart, "ROOT", str(tmp_path))
    monkeypatch.setattr(quickstart, "run_stages", lambda *args: calls.append(args) or {"build": 1.0})
    assert quickstart.main(argv + ["--stop-after", "build"]) == {"stage_wall_s": {"build": 1.0}}
    (root_arg, out, *_rest), = calls
    assert (root_arg, out, _rest[-1]) == (root, os.path.join(str(tmp_path), root), arch)
    assert os.path.isdir(out)


def test_the_default_llama_commands_are_unchanged_and_a_family_only_adds_its_flags(monkeypatch):
    llama = stages_by_name("outputs/tiny", None)
    assert "--arch" not in llama["build"].cmd[2]
    assert "m(['--output_dir', 'outputs/tiny/base'])" in llama["build"].cmd[2]
    assert llama["sft"].cmd[2:] == ["config/tiny/sft_argument.json"]  # the config's own paths and seed
    qwen3 = stages_by_name("outputs/tiny-qwen3", 42, arch="qwen3")
    assert "m(['--output_dir', 'outputs/tiny-qwen3/base', '--seed', '42', '--arch', 'qwen3'])" in qwen3["build"].cmd[2]
    plain = stages_by_name("outputs/tiny-qwen3", 42)
    assert [s.cmd for s in qwen3.values() if s.name != "build"] == [s.cmd for s in plain.values() if s.name != "build"]
    monkeypatch.setattr(quickstart_arch, "ARCH_OVERRIDES", {"qwen3_moe": {"sft": {"learning_rate": 0.002,
                                                                                   "max_steps": 1200}}})
    moe = stages_by_name("outputs/tiny-qwen3_moe", None, arch="qwen3_moe")
    assert moe["sft"].cmd[-4:] == ["--learning_rate", "0.002", "--max_steps", "1200"]
    assert moe["rm"].cmd == stages_by_name("outputs/tiny-qwen3_moe", None)["rm"].cmd
    assert stages_by_name("outputs/tiny", None)["sft"].cmd == llama["sft"].cmd  # other families' overrides: none here


def test_qwen3_moe_overrides_ppo_and_dpo_and_every_other_command_is_the_configs():
    """The measured overrides (docs/quickstart_families.md): Qwen3-MoE's PPO at KL coefficient 0.1,
    its DPO at 700 steps; its other stages, the Llama's and the dense Qwen3's commands are the
    configs' own."""
    moe = stages_by_name("outputs/tiny-qwen3_moe-seed43", 43, arch="qwen3_moe")
    plain = stages_by_name("outputs/tiny-qwen3_moe-seed43", 43)
    assert moe["ppo"].cmd == plain["ppo"].cmd + ["--kl_coeff", "0.1"]
    assert moe["dpo"].cmd == plain["dpo"].cmd + ["--max_steps", "700"]
    assert {n: s.cmd for n, s in moe.items() if n not in ("build", "ppo", "dpo")} == \
        {n: s.cmd for n, s in plain.items() if n not in ("build", "ppo", "dpo")}
    llama = stages_by_name("outputs/tiny", None)
    assert [llama[n].cmd[2:] for n in ("ppo", "dpo")] == [["config/tiny/ppo_argument.json"],
                                                          ["config/tiny/dpo_argument.json"]]
    qwen3 = stages_by_name("outputs/tiny-qwen3", 42, arch="qwen3")
    assert all(qwen3[n].cmd == s.cmd for n, s in stages_by_name("outputs/tiny-qwen3", 42).items() if n != "build")


def test_every_override_names_a_known_family_stage_and_argument():
    stage_configs = {"sft": "sft", "rm": "rm", "ppo": "ppo", "grpo": "grpo", "dpo": "dpo", "audit": "audit",
                     "online_dpo": "online_dpo"}
    for arch, stages in quickstart_arch.ARCH_OVERRIDES.items():
        assert arch in ARCHS and arch != "llama", arch
        for stage, values in stages.items():
            config = json.load(open(os.path.join(ROOT, "config", "tiny", f"{stage_configs[stage]}_argument.json")))
            assert set(values) <= set(config), (arch, stage, set(values) - set(config))


@pytest.mark.parametrize("arch, model_type", [("qwen3", "qwen3"), ("qwen3_moe", "qwen3_moe")])
def test_the_build_stage_writes_the_family_model(tmp_path, arch, model_type):
    """The build stage's own command, run in an empty directory: the base model is the family's
    (its `config.json`), the tokenizer and the demo data are written beside it."""
    build = stages_by_name(f"outputs/tiny-{arch}", None, arch=arch)["build"].cmd
    env = dict(os.environ, PYTHONPATH=ROOT, MKL_DEBUG_CPU_TYPE="5")
    done = subprocess.run([sys.executable] + build[1:], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    base = tmp_path / "outputs" / f"tiny-{arch}" / "base"
    config = json.load(open(base / "config.json"))
    assert config["model_type"] == model_type
    assert json.load(open(base / "tiny_factory.json"))["arch"] == arch
    assert (config.get("num_experts"), config.get("num_experts_per_tok")) == ((4, 2) if arch == "qwen3_moe" else (None, None))
    lines = open(tmp_path / "outputs" / f"tiny-{arch}" / "data" / "test.jsonl").read().splitlines()
    assert len(lines) == 300
