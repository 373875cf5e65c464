"""The command line of every entry point: `--help` lists the arguments with their help and exits
0; a bad argument file is ONE message on stderr listing every problem, exit status 2, no
traceback; third-party import warnings are not printed."""
import json
import os
import sys

import pytest

from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# script -> (a field it must list, a phrase of that field's help)
HELP_FIELDS = {
    "ppo/run_ppo.py": ("--kl_coeff", "KL penalty coefficient"),
    "sft/run_sft.py": ("--truncate_prompt_len", "keep their last ones"),
    "rm/run_reward.py": ("--normalizer_type", "Score normaliser"),
    "rm/audit_reward.py": ("--long_answer_tokens", "'very_long' probe"),
    "dpo/run_dpo.py": ("--sft_loss_ratio", "NLL of the chosen answers"),
    "dpo/run_online_dpo.py": ("--pair_selection", "the best against the worst"),
    "ppo/reward_server.py": ("--scorer", "registered scorer name"),
    "sft/merge_lora.py": ("--lora_path", "holds lora_config.json"),
}

HELP_DRIVER = """
import contextlib, io, json, runpy, sys
out = {}
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    buffer = io.StringIO()
    code = None
    with contextlib.redirect_stdout(buffer):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code
    out[script] = [code, buffer.getvalue()]
sys.stdout.write("RESULT" + json.dumps(out))
"""


def run(args, **kw):
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    return warm_python.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600, **kw)


def test_help_of_every_entry_point_lists_fields_with_help_and_exits_0():
    """Each script runs as `__main__` with `--help` (one interpreter for all eight: importing
    Paddle once); none may print a warning while starting."""
    done = run(["-c", HELP_DRIVER, *HELP_FIELDS])
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.split("RESULT", 1)[1])
    for script, (flag, help_phrase) in HELP_FIELDS.items():
        code, text = results[script]
        assert code == 0, (script, code)
        (line_index,) = [i for i, line in enumerate(text.splitlines()) if line.strip().startswith(flag + " ")]
        following = " ".join(" ".join(text.splitlines()[line_index:line_index + 4]).split())
        assert help_phrase in following, (script, following)
    for noise in ("Warning", "ccache", "distutils", "Traceback", "report_to"):
        assert noise not in done.stderr, done.stderr[-2000:]


FIVE_MISTAKES = {  # (unknown keys, bad choices and the table's ranges are refused before this pass: test_fast_start.py,
    # test_early_values.py)
    "top_entropy_frac": 0.0,  # 1. out of range
    "eval_num_samples": -1,  # 2. negative count
    "loss_scale_factor": -1.0,  # 3. out of range
    # 4. actor_model_name_or_path missing
    "use_rule_reward": True,  # 5. together with a reward model
}


def test_five_independent_mistakes_are_one_message_exit_2_without_traceback(tmp_path, tiny_rm_dir):
    config = dict(FIVE_MISTAKES, reward_model_name_or_path=tiny_rm_dir, output_dir=str(tmp_path / "out"),
                  train_datasets=["Jsonfile:1:data.jsonl"])
    path = tmp_path / "five.json"
    path.write_text(json.dumps(config))
    done = run(["ppo/run_ppo.py", str(path)])
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr
    error = done.stderr.strip()
    assert error.startswith("run_ppo.py: error: 5 arguments cannot be used:"), error
    lines = error.splitlines()[1:]
    assert len(lines) == 5, error
    for expected in ("top_entropy_frac must be in (0, 1]", "eval_num_samples must be >= 0",
                     "loss_scale_factor must be positive",
                     "actor_model_name_or_path is required", "use_rule_reward is set but reward_model_name_or_path="):
        assert sum(expected in line for line in lines) == 1, (expected, error)
    assert not os.path.exists(tmp_path / "out")  # refused before anything is written


DPO_FIVE_MISTAKES = {
    "beta": -0.1,  # 1. out of range
    "label_smoothing": 0.7,  # 2. out of range (the dataclass check)
    "pref_loss_ratio": -2,  # 3. a negative weight
    "model_name_or_path": "no_model_here",  # 4. no such directory (the file-system check)
    "do_train": False,  # 5. a run that would train and save nothing
}


def test_dpo_five_independent_mistakes_are_one_message_exit_2_without_traceback(tmp_path):
    """The same for a Trainer entry point (SFT, RM and DPO share its start-up pass)."""
    config = dict(DPO_FIVE_MISTAKES, model_name_or_path=str(tmp_path / "no_model_here"), output_dir=str(tmp_path / "out"),
                  train_datasets=["PKU-SafeRLHF/train:1:data.jsonl"])
    path = tmp_path / "five.json"
    path.write_text(json.dumps(config))
    done = run(["dpo/run_dpo.py", str(path)])
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr
    error = done.stderr.strip()
    assert error.startswith("run_dpo.py: error: 5 arguments cannot be used:"), error
    lines = error.splitlines()[1:]
    assert len(lines) == 5, error
    for expected in ("beta must be positive, got -0.1",
                     "label_smoothing must lie in [0, 0.5), got 0.7", "pref_loss_ratio must be >= 0",
                     f"model_name_or_path={tmp_path / 'no_model_here'}: no such directory", "do_train is false or missing"):
        assert sum(expected in line for line in lines) == 1, (expected, error)
    assert not os.path.exists(tmp_path / "out")


def test_small_command_lines_give_one_line_errors(tmp_path, tiny_model_dir):
    done = run(["sft/merge_lora.py", "--lora_path", tiny_model_dir, "--output_dir", tiny_model_dir])
    assert done.returncode == 2 and "Traceback" not in done.stderr and "usage:" not in done.stderr
    message = done.stderr.strip()
    assert message.startswith("merge_lora.py: error: 2 arguments cannot be used:"), message
    assert "no lora_config.json" in message and f"output_dir={tiny_model_dir} is the input model directory of lora_path" in message


@pytest.mark.parametrize("argv, phrase", [(["--port", "eighty"], "argument --port: invalid int value: 'eighty'"),
                                          (["--colour", "red"], "unrecognized arguments: --colour red")])
def test_reward_server_flag_errors_are_one_line_exit_2(argv, phrase, capsys):
    from ppo.reward_server import parse_args

    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and phrase in err and "usage:" not in err, err


def test_run_and_exit_maps_usage_errors_to_exit_2_and_keeps_other_tracebacks(capsys):
    from ppo.common.argument_problems import ArgumentError
    from ppo.common.process_exit import run_and_exit
    from ppo.data.base import DataError

    for error in (ArgumentError("2 arguments cannot be used:\n  a\n  b"), DataError("empty prompt", path="d.jsonl", line=3)):
        def main(error=error):
            raise error

        with pytest.raises(SystemExit) as exit_:
            run_and_exit(main)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.endswith(f"error: {error}\n") and "Traceback" not in err
    with pytest.raises(ZeroDivisionError):
        run_and_exit(lambda: 1 / 0)


def test_import_warnings_are_held_back_and_logged_once_at_debug(caplog):
    import logging
    import warnings

    from paddlenlp.utils.log import logger as paddlenlp_logger

    from ppo.common.quiet_start import quiet_third_party_warnings

    with caplog.at_level(logging.DEBUG, logger="ppo"):
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            with quiet_third_party_warnings():
                for _ in range(3):
                    warnings.warn("No ccache found.", UserWarning)
                warnings.warn("old API", DeprecationWarning)
        paddlenlp_logger.info("The default value for the training argument `--report_to` will change in v5 (...)")
    assert shown == []  # nothing reached the console
    debug = [r.getMessage() for r in caplog.records if r.name == "ppo" and r.levelno == logging.DEBUG]
    assert len([m for m in debug if "UserWarning" in m and "No ccache found." in m]) == 1
    assert len([m for m in debug if "DeprecationWarning" in m and "old API" in m]) == 1
    assert any(m.startswith("PaddleNLP: The default value for the training argument `--report_to`") for m in debug)
