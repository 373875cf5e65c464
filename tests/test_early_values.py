"""Choices and ranges of argument values are checked by the stored argument table before Paddle
loads (`ppo/common/early_values.py`), with a "did you mean", not after the tokenizer and the
datasets; and the table works wherever the package is installed (it hashes the package's own
files by their paths inside it, and keys PaddleNLP by its version)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from ppo.common import argument_table
from ppo.common.argument_parsing import parse_collecting
from ppo.common.entry_points import ENTRY_POINTS
from tests.test_fast_start import DRIVER, run_fresh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("ppo", "sft", "rm", "dpo", "rl", "scripts")  # what setup.py installs


def test_a_misspelt_choice_is_refused_before_paddle_with_the_closest_name():
    runs, heavy = run_fresh(["ppo/run_ppo.py"], ["config/tiny/grpo_argument.json", "--policy_loss", "gspoo"])
    assert heavy == []  # no Paddle, no PaddleNLP, no tokenizer, no data
    code, out, err = runs["ppo/run_ppo.py"]
    assert code == 2 and "Traceback" not in err
    assert err == ("run_ppo.py: error: policy_loss must be one of 'ppo_clip', 'gspo', 'cispo', 'gmpo', 'clip_cov', "
                   "'kl_cov', got 'gspoo'; did you mean 'gspo'?\n")


def test_choices_and_ranges_of_several_entry_points_in_one_message_each():
    runs, heavy = run_fresh(["ppo/run_ppo.py"], ["config/tiny/grpo_argument.json", "--adv_estimator", "grp",
                                                 "--rollout_n", "0", "--learning_rate=-1e-07", "--kl_estimator", "k9"])
    assert heavy == []
    code, _, err = runs["ppo/run_ppo.py"]
    assert code == 2
    lines = err.splitlines()
    assert lines[0] == "run_ppo.py: error: 4 arguments cannot be used:"
    assert sorted(lines[1:]) == sorted([
        "  learning_rate=-1e-07 (must be >= 0)",
        "  adv_estimator must be one of 'gae', 'grpo', 'rloo', 'reinforce_pp', 'reinforce_pp_baseline', 'pass_at_k', "
        "'vapo' or module.path:NAME of an AdvEstimator, got 'grp'; did you mean 'grpo'?",
        "  rollout_n=0 (must be an integer >= 1)",
        "  kl_estimator must be one of 'k1', 'kl', 'k2', 'mse', 'k3', 'low_var_kl', got 'k9'",
    ])
    runs, heavy = run_fresh(["rm/run_reward.py", "dpo/run_dpo.py"], ["--loss_type", "sequence_wise", "--adam_beta2", "1.5",
                                                                    "--output_dir", "x"])
    assert heavy == []
    assert runs["rm/run_reward.py"][2].splitlines() == [
        "run_reward.py: error: 2 arguments cannot be used:",
        "  loss_type must be one of 'sequence-wise', 'token-wise', got 'sequence_wise'; did you mean 'sequence-wise'?",
        "  adam_beta2=1.5 (must be in [0, 1))"]
    assert runs["dpo/run_dpo.py"][2].startswith("run_dpo.py: error: 2 arguments cannot be used:\n  loss_type must be one of")


def test_a_value_of_ones_own_module_passes_the_early_check():
    from ppo.common.early_values import choice_problem, given_values

    assert choice_problem("adv_estimator", "mine.estimators:POWERED", ["gae", "grpo"], "module.path:NAME") is None
    assert choice_problem("policy_loss", "mine:loss", ["ppo_clip"]) == \
        "policy_loss must be one of 'ppo_clip', got 'mine:loss'"
    assert given_values(["--a", "1", "--b", "x", "y", "--a", "2", "--c"], lambda k, t: int(t) if k == "a" else t) == {"a": 2}


@pytest.mark.parametrize("entry", [e for e in ENTRY_POINTS if e.arguments], ids=lambda e: e.command)
def test_the_full_pass_refuses_every_value_the_early_pass_refuses(entry):
    """Each stored choice field: a wrong name is refused by the entry point's own checks too, and
    its first and last stored names by neither (the early pass never refuses what a run accepts)."""
    import importlib

    stored = argument_table.load_entry_table(entry.command)
    assert stored is not None
    classes = argument_table.import_classes(entry)
    validate = getattr(importlib.import_module(classes[0].__module__), "validate_arguments", None)
    for name, (choices, _) in stored["choices"].items():
        _, problems = parse_collecting(classes, ["--output_dir", "x", f"--{name}", "surely_not_a_choice"], validate)
        assert any(name in p and "surely_not_a_choice" in p for p in problems), (entry.command, name, problems)
        for value in {choices[0], choices[-1]}:
            _, problems = parse_collecting(classes, ["--output_dir", "x", f"--{name}", value], validate)
            assert not any(f"{name} must be one of" in p for p in problems), (entry.command, name, value, problems)


def test_the_table_names_only_files_of_the_package():
    from importlib.metadata import version

    assert argument_table.paddlenlp_version() == version("paddlenlp")  # read from its dist-info directly
    sources = json.load(open(argument_table.TABLE_PATH))["sources"]
    assert sources and all(path.split("/")[0] in PACKAGES for path in sources), sorted(sources)
    assert "ppo/algos/policy_registry.py" in sources  # where the policy_loss names come from


def installed_copy(tmp_path):
    """The toolkit's packages as another environment holds them (no `.venv` beside them)."""
    site = tmp_path / "site-packages"
    for package in PACKAGES:
        shutil.copytree(os.path.join(ROOT, package), site / package, ignore=shutil.ignore_patterns("__pycache__"))
    return str(site)


def test_help_and_argument_errors_skip_paddle_in_another_install(tmp_path):
    """The packages copied out of the repository (as `pip install` or another checkout's `pip install
    -e .` puts them, PaddleNLP where that environment keeps it): the table is still used."""
    site = installed_copy(tmp_path)
    env = dict(os.environ, PYTHONPATH=site, MKL_DEBUG_CPU_TYPE="5")
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(["ppo/run_ppo.py", "sft/run_sft.py"]),
                           json.dumps(["--help"])], cwd=site, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert result["heavy"] == []
    for script in ("ppo/run_ppo.py", "sft/run_sft.py"):
        code, out, _ = result["runs"][script]
        assert code == 0 and "--learning_rate" in out, (script, out[:300])
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(["ppo/run_ppo.py"]), json.dumps(["--policy_loss", "gspoo"])],
                          cwd=site, env=env, capture_output=True, text=True, timeout=600)
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert result["heavy"] == [] and result["runs"]["ppo/run_ppo.py"][0] == 2
    assert "did you mean 'gspo'?" in result["runs"]["ppo/run_ppo.py"][2]
