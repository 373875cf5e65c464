"""JSON + command-line argument parsing: overrides, unknown keys, path resolution."""
import json
from dataclasses import dataclass, field
from typing import List, Optional

import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments, save_resolved_arguments


@dataclass
class ToyModelArgs:
    model_name_or_path: str = field(default="m", metadata={"help": "model"})
    use_lora: bool = field(default=False, metadata={"help": "lora"})


@dataclass
class ToyDataArgs:
    train_datasets: List[str] = field(default_factory=lambda: ["a"], metadata={"help": "datasets"})
    max_length: int = field(default=8, metadata={"help": "length"})
    eval_path: Optional[str] = field(default=None, metadata={"help": "eval"})


def write(tmp_path, obj, name="args.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def test_json_then_command_line_override(tmp_path):
    path = write(tmp_path, {"model_name_or_path": "x", "use_lora": True, "train_datasets": ["p:0.5", "q"], "max_length": 16})
    m, d = parse_arguments((ToyModelArgs, ToyDataArgs), [path, "--max_length", "32"])
    assert m.model_name_or_path == "x" and m.use_lora is True
    assert d.train_datasets == ["p:0.5", "q"] and d.max_length == 32 and d.eval_path is None


def test_unknown_json_key_names_file_key_and_closest(tmp_path):
    path = write(tmp_path, {"max_lenght": 16})
    with pytest.raises(ArgumentError, match=r"args.json: unknown argument 'max_lenght'; did you mean 'max_length'"):
        parse_arguments((ToyModelArgs, ToyDataArgs), [path])


def test_unknown_flag_is_an_error(tmp_path):
    with pytest.raises(ArgumentError, match="command line: unknown argument 'use_lor'; did you mean 'use_lora'"):
        parse_arguments((ToyModelArgs, ToyDataArgs), ["--use_lor", "True"])


def test_bad_json_and_missing_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"max_length": 3,,}')
    with pytest.raises(ArgumentError, match="bad.json: invalid JSON at line 1"):
        parse_arguments((ToyModelArgs, ToyDataArgs), [str(p)])
    with pytest.raises(ArgumentError, match="argument file not found"):
        parse_arguments((ToyModelArgs, ToyDataArgs), ["nope/missing.json"])


def test_relative_config_resolves_against_repo_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (m, d) = parse_arguments((ToyModelArgs, ToyDataArgs), ["tests/fixtures/toy_argument.json"])
    assert m.model_name_or_path == "toy-from-repo-root"


def test_resolved_arguments_written(tmp_path):
    m, d = parse_arguments((ToyModelArgs, ToyDataArgs), ["--max_length", "5"])
    path = save_resolved_arguments(str(tmp_path), m, d)
    data = json.load(open(path))
    assert data["ToyDataArgs"]["max_length"] == 5 and data["ToyModelArgs"]["use_lora"] is False
