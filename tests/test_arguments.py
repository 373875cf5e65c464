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


# ---------------------------------------------------------------- file and value problems (issue 28)


@dataclass
class ToyTrainArgs:
    rollout_n: int = field(default=1, metadata={"help": "samples"})
    output_dir: str = field(default="out", metadata={"help": "where"})
    temperature: float = field(default=1.0, metadata={"help": "temperature"})


TOY = (ToyModelArgs, ToyDataArgs, ToyTrainArgs)


def test_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"max_length": 12}).encode())
    _, d, _ = parse_arguments(TOY, [str(p)])
    assert d.max_length == 12


def test_bad_byte_is_reported_by_line(tmp_path):
    p = tmp_path / "latin.json"
    p.write_bytes(b'{\n  "max_length": 12,\n  "model_name_or_path": "caf\xe9"\n}')
    with pytest.raises(ArgumentError, match=r"latin.json: line 3, column 29: byte 0xe9 is not UTF-8"):
        parse_arguments(TOY, [str(p)])


def test_key_given_twice_names_the_key_and_both_lines(tmp_path):
    p = tmp_path / "twice.json"
    p.write_text('{\n  "rollout_n": 4,\n  "max_length": 8,\n  "rollout_n": 8\n}')
    with pytest.raises(ArgumentError, match=r"twice.json: key given twice \(keep one\): 'rollout_n' on lines 2 and 4"):
        parse_arguments(TOY, [str(p)])
    y = tmp_path / "twice.yaml"
    y.write_text("rollout_n: 4\nmax_length: 8\nrollout_n: 8\n")
    with pytest.raises(ArgumentError, match=r"twice.yaml: key given twice \(keep one\): 'rollout_n' on lines 1 and 3"):
        parse_arguments(TOY, [str(y)])


def test_list_for_a_scalar_names_the_key_and_the_expected_type(tmp_path):
    path = write(tmp_path, {"rollout_n": [4, 8], "temperature": "hot", "max_length": 8})
    with pytest.raises(ArgumentError) as info:
        parse_arguments(TOY, [path])
    lines = str(info.value).splitlines()
    assert lines[0] == "2 arguments cannot be used:"
    assert lines[1].endswith("args.json: rollout_n: expected an integer, got a list [4, 8]")
    assert lines[2].endswith("args.json: temperature: expected a number, got 'hot'")


def test_argument_file_named_txt_or_a_directory_says_so(tmp_path):
    txt = tmp_path / "args.txt"
    txt.write_text("{}")
    with pytest.raises(ArgumentError, match=r"args.txt: argument files are read by their extension and must end in "
                                            r"\.json, \.yaml or \.yml \(rename it, e.g. to .*args\.json\)"):
        parse_arguments(TOY, [str(txt)])
    with pytest.raises(ArgumentError, match=rf"{tmp_path} is a directory; give the argument file inside it"):
        parse_arguments(TOY, [str(tmp_path), "--max_length", "3"])


def test_tilde_is_expanded_in_path_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cfg.json").write_text(json.dumps({"model_name_or_path": "~/models/sft", "output_dir": "~/runs/a"}))
    m, _, t = parse_arguments(TOY, ["~/cfg.json"])
    assert m.model_name_or_path == f"{tmp_path}/models/sft" and t.output_dir == f"{tmp_path}/runs/a"
    m, _, t = parse_arguments(TOY, ["--output_dir=~/runs/b", "--model_name_or_path", "~/m"])
    assert m.model_name_or_path == f"{tmp_path}/m" and t.output_dir == f"{tmp_path}/runs/b"
    from ppo.data.specs import parse_dataset_spec  # dataset specs: the path part, when the dataset is read

    assert parse_dataset_spec(["Jsonfile:1:~/d.jsonl", "~/e.jsonl"]) == [
        ("Jsonfile", 1.0, f"{tmp_path}/d.jsonl"), ("Jsonfile", 1.0, f"{tmp_path}/e.jsonl")]


def test_unknown_keys_values_and_dataclass_checks_come_in_one_error(tmp_path):
    """A problem in every stage: an unknown key (file), a bad value (command line), a dataclass
    refusal (`__post_init__`) and the entry point's validate pass."""

    @dataclass
    class Checked:
        lr: float = field(default=1e-3, metadata={"help": "lr"})

        def __post_init__(self):
            from ppo.common.argument_problems import problem_scope

            with problem_scope() as problems:
                if self.lr <= 0:
                    problems.append(f"lr must be positive, got {self.lr}")

    path = write(tmp_path, {"max_lenght": 3, "lr": -1})
    with pytest.raises(ArgumentError) as info:
        parse_arguments((ToyModelArgs, ToyDataArgs, Checked), [path, "--max_length", "x"],
                        validate=lambda m, d, c: [f"validate saw lr={c.lr}"])
    assert str(info.value).splitlines()[1:] == [
        f"  {path}: unknown argument 'max_lenght'; did you mean 'max_length'?",
        "  command line: max_length: expected an integer, got 'x'",
        "  lr must be positive, got -1.0",
        "  validate saw lr=-1.0",
    ]
    with pytest.raises(ArgumentError, match="lr must be positive, got -2"):
        Checked(lr=-2)  # built in code: raised at once


def test_help_lists_every_field_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_arguments(TOY, ["--max_length", "3", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "ToyDataArgs:\n  --train_datasets List[str] (default: ['a'])\n      datasets" in out
    assert "  --rollout_n int (default: 1)\n      samples" in out


@dataclass
class SignedArgs:
    shift: float = field(default=0.0, metadata={"help": "a value that may be negative"})
    shifts: List[float] = field(default_factory=list, metadata={"help": "values that may be negative"})


@pytest.mark.parametrize("argv_tail", [["--shift=-1e-4"], ["--shift", "-1e-4"], ["--shift", "-0.0001"]])
def test_negative_numbers_in_exponent_form_are_values(tmp_path, argv_tail):
    """argparse alone reads `-1e-4` as an unknown flag ("expected one argument"); in a file, in
    `--flag=value` and in `--flag value` form it is the value."""
    path = write(tmp_path, {"shift": -1e-07, "shifts": [-2.5e-3, 1e-07, -3]})
    (from_file,) = parse_arguments((SignedArgs,), [path])
    assert from_file.shift == -1e-07 and from_file.shifts == [-2.5e-3, 1e-07, -3.0]
    (from_flag,) = parse_arguments((SignedArgs,), [path, *argv_tail])
    assert from_flag.shift == -1e-4


def test_small_command_lines_take_negative_exponents_too():
    from ppo.common.argument_help import OneMessageArgumentParser

    parser = OneMessageArgumentParser()
    parser.add_argument("--weights", nargs="+", type=float)
    assert parser.parse_args(["--weights", "-1e-3", "2E+1"]).weights == [-1e-3, 20.0]
