"""`--help` and argument errors before Paddle loads (the stored argument table), the scripts'
`--help` descriptions, and the installed `paddle-align` command.

Each check runs the scripts in a fresh interpreter (not the tests' warm one, which has Paddle
loaded) and asserts that neither Paddle nor PaddleNLP was imported: that is what makes `--help`
and argument errors take a fraction of a second instead of the several seconds of those imports.
"""
import ast
import configparser
import glob
import json
import os
import subprocess
import sys

import pytest

from ppo.common import argument_table
from ppo.common.argument_help import doc_summary, help_text
from ppo.common.entry_points import ENTRY_POINTS, entry_point

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE_SCRIPTS = [e.script for e in ENTRY_POINTS if e.arguments]
SMALL_SCRIPTS = ["ppo/reward_server.py", "sft/merge_lora.py", "scripts/quickstart.py"]

DRIVER = """
import contextlib, io, json, runpy, sys
out = {}
scripts, argv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for script in scripts:
    sys.argv = [script, *argv]
    stdout, stderr, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code
    out[script] = [code, stdout.getvalue(), stderr.getvalue()]
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("paddle", "paddlenlp"))
sys.stdout.write("RESULT" + json.dumps({"runs": out, "heavy": heavy}))
"""


def run_fresh(scripts, argv):
    """Run each script as `__main__` with `argv` in ONE fresh interpreter; returns
    `({script: [exit code, stdout, stderr]}, the paddle/paddlenlp modules imported)`."""
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(scripts), json.dumps(argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, MKL_DEBUG_CPU_TYPE="5"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    return result["runs"], result["heavy"]


def test_the_stored_argument_table_is_current():
    stored = open(argument_table.TABLE_PATH, encoding="utf-8").read()
    assert stored == argument_table.table_text(argument_table.build_table()), "run: python scripts/gen_args_doc.py"


def test_help_of_every_entry_point_comes_without_paddle_and_equals_the_dataclasses_help():
    runs, heavy = run_fresh(TABLE_SCRIPTS + SMALL_SCRIPTS, ["--help"])
    assert heavy == []
    for script in TABLE_SCRIPTS:
        code, out, err = runs[script]
        classes = argument_table.import_classes(next(e for e in ENTRY_POINTS if e.script == script))
        assert (code, err) == (0, ""), (script, err)
        assert out == help_text(classes, os.path.basename(script)), script
    for script in SMALL_SCRIPTS:
        code, out, _ = runs[script]
        assert code == 0 and out.startswith(f"usage: {os.path.basename(script)}"), (script, out[:300])


def test_argument_file_errors_come_without_paddle_in_one_message(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"kl_coef": 0.1, "max_dec_len": "ten", "learning_rate": -1e-07, "use_rm_server": "maybe"}))
    runs, heavy = run_fresh(["ppo/run_ppo.py"], [str(path)])
    assert heavy == []
    code, out, err = runs["ppo/run_ppo.py"]
    assert code == 2 and "Traceback" not in err
    assert err.splitlines() == [
        "run_ppo.py: error: 5 arguments cannot be used:",
        f"  {path}: unknown argument 'kl_coef'; did you mean 'kl_coeff'?",
        f"  {path}: max_dec_len: expected an integer, got 'ten'",
        f"  {path}: use_rm_server: expected true or false, got 'maybe'",
        "  learning_rate=-1e-07 (must be >= 0)",  # ranges and choices: tests/test_early_values.py
        "  command line: the following arguments are required: --output_dir",
    ]
    bad = tmp_path / "bad.json"
    bad.write_text('{"output_dir": "x",}')
    runs, heavy = run_fresh(["sft/run_sft.py"], [str(bad), "--max_length", "16"])
    assert heavy == [] and runs["sft/run_sft.py"][:1] == [2]
    assert runs["sft/run_sft.py"][2] == f"run_sft.py: error: {bad}: invalid JSON at line 1, column 20: Expecting property " \
                                        "name enclosed in double quotes\n"


def test_a_table_older_than_the_argument_sources_is_not_used(tmp_path, monkeypatch):
    assert argument_table.load_entry_table("ppo") is not None
    table = json.load(open(argument_table.TABLE_PATH))
    table["sources"]["ppo/entry/ppo_arguments.py"] = "0" * 64  # as after an edit without rebuilding the table
    stale = tmp_path / "argument_table.json"
    stale.write_text(json.dumps(table))
    monkeypatch.setattr(argument_table, "TABLE_PATH", str(stale))
    assert argument_table.load_entry_table("ppo") is None
    assert argument_table.check_early("ppo", ["--help"]) is None  # the full parse answers instead


def test_script_descriptions_are_whole_sentences():
    """`--help` shows a script's first docstring paragraph; its first line alone stopped
    mid-sentence ("build the model and data, then")."""
    done = subprocess.run([sys.executable, "scripts/quickstart.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert "then SFT -> reward model -> reward audit -> PPO -> GRPO (with a reward server) -> DPO" in " ".join(done.stdout.split())
    for path in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True):
        if ".venv" in path:
            continue
        text = open(path, encoding="utf-8").read()
        if 'description=__doc__.split("\\n")[0]' in text:
            first_line = ast.get_docstring(ast.parse(text)).split("\n")[0]
            assert first_line.endswith("."), (path, first_line)
    assert doc_summary("One line\ngoes on.\n\n    usage") == "One line goes on."


def test_paddle_align_runs_every_entry_point_by_its_command():
    from ppo import cli

    setup = open(os.path.join(ROOT, "setup.py")).read()
    assert '"console_scripts": ["paddle-align=ppo.cli:main"]' in setup
    assert "argument_table.json" in setup  # installed with the package
    assert entry_point("grpo").script == entry_point("ppo").script == "ppo/run_ppo.py"
    assert all(os.path.isfile(os.path.join(ROOT, e.script)) for e in ENTRY_POINTS)
    done = subprocess.run([sys.executable, "-m", "ppo.cli", "--help"], cwd="/", capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0
    for e in ENTRY_POINTS:
        assert f"  {e.command}" in done.stdout and e.script in done.stdout
    runs = {}
    for command in ("sft", "grpo", "reward-server"):  # from another directory, as an installed command runs
        done = subprocess.run([sys.executable, "-m", "ppo.cli", command, "--help"], cwd="/", capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
        runs[command] = (done.returncode, done.stdout)
    assert runs["sft"][0] == 0 and "--truncate_prompt_len" in runs["sft"][1]
    assert runs["grpo"][0] == 0 and "--adv_estimator" in runs["grpo"][1]
    assert runs["reward-server"][0] == 0 and "--scorer" in runs["reward-server"][1]
    assert cli.main(["no-such-command"]) == 2


@pytest.mark.parametrize("command", ["sft", "ppo"])
def test_paddle_align_passes_argument_errors_through(command, tmp_path):
    done = subprocess.run([sys.executable, "-m", "ppo.cli", command, "--no_such_flag", "1"], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 2 and "unknown argument 'no_such_flag'" in done.stderr and "Traceback" not in done.stderr
