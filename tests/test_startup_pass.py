"""The start-up pass: every problem a run can know before any model loads, in ONE message, exit
status 2, no traceback: value ranges, data files (found, parseable, not empty), the reward server
(reachable, accepting this run's token), every model's tokenizer against its embedding. An
argument file that cannot be read gives its own error alone."""
import json
import os
import shutil
import sys
from dataclasses import dataclass, field

import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.serving.reward_client import startup_problem
from tests import warm_python
from tests.test_reward_server import ServerProcess, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_LOADED = "Loading weights file"  # PaddleNLP's line when a model's weights load


def run_script(args):
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    return warm_python.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)


def broken_data(tmp_path):
    """(missing file, file with a malformed second line, empty file)."""
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text('{"src": "Reverse: ab", "tgt": "ba"}\n{"src": oops}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    return str(tmp_path / "missing.jsonl"), str(malformed), str(empty)


def test_grpo_lists_range_data_and_reward_server_token_problems_in_one_message(tiny_model_dir, tmp_path):
    missing, malformed, _ = broken_data(tmp_path)
    server = ServerProcess("--scorer", "reverse", "--token", "s3cret")
    try:
        config = json.load(open(os.path.join(ROOT, "config/tiny/grpo_argument.json")))
        config.update(actor_model_name_or_path=tiny_model_dir, reward_server=server.url, reward_server_token="wrong",
                      top_entropy_frac=0.0, train_datasets=f"Jsonfile:1.0:{missing}",
                      eval_datasets=f"Jsonfile:1.0:{malformed}", output_dir=str(tmp_path / "out"))
        path = tmp_path / "grpo.json"
        path.write_text(json.dumps(config))
        done = run_script(["ppo/run_ppo.py", str(path)])
    finally:
        server.cleanup()
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and MODEL_LOADED not in done.stdout + done.stderr
    error = done.stderr.strip()
    assert error.startswith("run_ppo.py: error: 4 problems stop this run before any model loads:"), error
    lines = error.splitlines()[1:]
    assert lines[0] == "  top_entropy_frac must be in (0, 1] (1: every token), got 0.0"  # (a range of its own check:
    # those of the value table are refused before Paddle loads, tests/test_early_values.py)
    assert lines[1] == f"  {missing}: file not found (dataset 'Jsonfile')"
    assert lines[2].startswith(f"  {malformed}, line 2: malformed JSON")
    assert lines[3].startswith(f"  reward_server {server.url}: reward server {server.url} requires a token and refuses "
                               "this client's: wrong bearer token")
    assert not os.path.exists(tmp_path / "out")


def test_a_reward_server_that_is_not_there_is_one_line_at_once():
    url = f"http://127.0.0.1:{free_port()}"
    assert startup_problem(url) == (
        f"reward_server {url}: no reward server answers there (connection refused); start it first, e.g. "
        f"python ppo/reward_server.py --port {url.rsplit(':', 1)[1]} --scorer NAME (use_rm_server true needs it)")


def test_sft_finds_bad_values_and_every_broken_data_file_before_the_model_loads(tiny_model_dir, tmp_path, capfd):
    from sft.run_sft import main as run_sft
    from tests.test_trainer_faults import sft_argv

    missing, malformed, empty = broken_data(tmp_path)
    argv = sft_argv(tiny_model_dir, str(tmp_path), str(tmp_path / "out"), "--learning_rate=-1e-4", "--adam_beta2", "1.0",
                    "--train_datasets", f"Jsonfile:1.0:{missing}", f"Jsonfile:1.0:{malformed}",
                    "--eval_datasets", f"Jsonfile:1.0:{empty}")
    with pytest.raises(ArgumentError) as info:
        run_sft(argv)
    lines = str(info.value).splitlines()
    assert lines[0] == "4 problems stop this run before any model loads:", lines
    assert lines[1:3] == ["  learning_rate=-0.0001 (must be >= 0)", "  adam_beta2=1.0 (must be in [0, 1))"]
    assert lines[3] == f"  {missing}: file not found (dataset 'Jsonfile')"  # the first file stops the train set
    assert lines[4] == f"  {empty}: SupervisedDataset has no samples: the data holds no records"
    assert MODEL_LOADED not in "".join(capfd.readouterr())
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("entry", ["rm.run_reward", "dpo.run_dpo"])
def test_reward_model_and_dpo_list_every_broken_preference_file(entry, tiny_model_dir, tmp_path):
    import importlib

    missing, malformed, _ = broken_data(tmp_path)
    config = "config/tiny/rm_argument.json" if entry.startswith("rm") else "config/tiny/dpo_argument.json"
    argv = [config, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
            "--train_datasets", f"PKU-SafeRLHF/train:1.0:{missing}", "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{malformed}",
            "--eval_generation_datasets", ""][: 9 if entry.startswith("rm") else 11]
    with pytest.raises(ArgumentError) as info:
        importlib.import_module(entry).main(argv)
    lines = str(info.value).splitlines()
    assert lines[0] == "2 problems stop this run before any model loads:", lines
    assert missing in lines[1] and "file not found" in lines[1]
    assert lines[2].startswith(f"  {malformed}, line 2: malformed JSON") or f"{malformed}, line 2: malformed JSON" in lines[2]


@dataclass
class NeedsOutput:
    output_dir: str = field(metadata={"help": "required, as PaddleNLP's"})
    max_length: int = field(default=8, metadata={"help": "length"})


def test_an_unreadable_argument_file_gives_only_its_own_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"max_length": 3,,}')
    for argv, expected in (([str(bad)], f"{bad}: invalid JSON at line 1, column 18: Expecting property name enclosed in "
                                        "double quotes"),
                           ([str(tmp_path)], f"{tmp_path} is a directory; give the argument file inside it (a .json, "
                                             ".yaml or .yml file)"),
                           (["missing.json", "--max_lenght", "2"], "argument file not found: missing.json (also looked in "
                                                                   f"{os.path.join(ROOT, 'missing.json')})")):
        with pytest.raises(ArgumentError) as info:
            parse_arguments((NeedsOutput,), argv)
        assert str(info.value) == expected  # not also "the following arguments are required: --output_dir"


@pytest.fixture(scope="module")
def rm_with_grown_tokenizer(tiny_rm_dir, tmp_path_factory):
    """The tiny reward model whose own tokenizer has two more tokens than its embedding has rows."""
    from ppo.models.loading import load_tokenizer

    path = str(tmp_path_factory.mktemp("rm_grown") / "rm")
    shutil.copytree(tiny_rm_dir, path)
    tokenizer = load_tokenizer(path)
    tokenizer.add_tokens(["<extra_a>", "<extra_b>"])
    tokenizer.save_pretrained(path)
    return path


def test_a_reward_model_whose_tokenizer_outgrows_its_embedding_is_refused_at_start(
        tiny_model_dir, rm_with_grown_tokenizer, tiny_data_dir, tmp_path, capfd):
    from ppo.models.loading import load_tokenizer
    from ppo.run_ppo import start_up
    from tests.test_ppo_trainer import ppo_argv

    vocab = json.load(open(os.path.join(rm_with_grown_tokenizer, "config.json")))["vocab_size"]
    top = max(load_tokenizer(rm_with_grown_tokenizer).get_vocab().values())
    assert top >= vocab  # the case: ids beyond the embedding
    with pytest.raises(ArgumentError) as info:
        start_up(ppo_argv(tiny_model_dir, rm_with_grown_tokenizer, tiny_data_dir, str(tmp_path / "out"),
                          "--reward_critic_model_name_or_path", tiny_model_dir))
    assert str(info.value) == (
        f"reward_model_name_or_path={rm_with_grown_tokenizer}: the tokenizer produces ids up to {top} but the model's "
        f"embedding has {vocab} rows (vocab_size); resize the embedding or use the model's own tokenizer")
    assert MODEL_LOADED not in "".join(capfd.readouterr())
