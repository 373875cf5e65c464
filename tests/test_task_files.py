"""PaddleNLP's task files (`train_task_config`, `eval_task_config`, `ptx_task_config`): a JSON
list of `{filepath, prob}` sources read as our dataset specs, mixed by weight."""
import json
from collections import Counter

import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.common.task_files import task_file_specs
from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments

CLASSES = (ModelArgument, DataArgument, PPOTrainingArguments)


def write_jsonl(path, word, n):
    path.write_text("".join(json.dumps({"src": [f"say {word} {i}"], "tgt": [word]}) + "\n" for i in range(n)))
    return str(path)


def write_task_file(path, entries):
    path.write_text(json.dumps(entries))
    return str(path)


@pytest.fixture
def two_sources(tmp_path):
    """40 'alpha' prompts at weight 1 and 30 'beta' prompts at weight 3 (relative path)."""
    write_jsonl(tmp_path / "alpha.jsonl", "alpha", 40)
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "beta.jsonl", "beta", 30)
    return write_task_file(tmp_path / "task_ppo.json", [
        {"task_name": "alpha", "filepath": str(tmp_path / "alpha.jsonl"), "prob": 1},
        {"task_name": "beta", "filepath": "data/beta.jsonl", "prob": 3.0},  # beside the task file
        {"filepath": str(tmp_path / "alpha.jsonl"), "prob": 0},  # weight 0: left out
    ])


def test_task_file_maps_to_weighted_specs(two_sources, tmp_path):
    # beta has the most weight per record (3 / 30): read whole; alpha gives 30 / 3 = 10 of its 40
    assert task_file_specs(two_sources) == [
        f"Jsonfile:{(1 / 40) / (3 / 30)!r}:{tmp_path / 'alpha.jsonl'}", f"Jsonfile:1.0:{tmp_path / 'data' / 'beta.jsonl'}",
    ]


def test_the_prompt_mix_follows_the_weights(two_sources, tiny_model_dir, tmp_path):
    from ppo.models.loading import load_tokenizer
    from ppo.run_ppo import build_datasets

    _, data, train = parse_arguments(CLASSES, [
        "--train_task_config", two_sources, "--eval_task_config", two_sources, "--output_dir", str(tmp_path / "o"),
        "--max_prompt_len", "64",
    ])
    assert len(data.train_datasets) == 2 and data.eval_datasets == data.train_datasets
    prompts, evaluation, _ = build_datasets(data, train, load_tokenizer(tiny_model_dir), require_label=True)
    words = Counter(prompts[i]["src"].split()[1] for i in range(len(prompts)))
    assert words == {"alpha": 10, "beta": 30} and len(evaluation) == 40  # 1 : 3, as the weights
    assert len({prompts[i]["src"] for i in range(len(prompts))}) == 40  # a sub-sample, nothing repeated


def test_ptx_task_file_and_a_conflict_with_train_datasets(two_sources, tmp_path):
    _, data, _ = parse_arguments(CLASSES, ["--ptx_task_config", two_sources, "--output_dir", str(tmp_path / "o")])
    assert [s.split(":")[0] for s in data.ptx_datasets] == ["Jsonfile", "Jsonfile"]
    with pytest.raises(ArgumentError, match="'train_task_config' \\(PaddleNLP's name for 'train_datasets'\\) conflicts"):
        parse_arguments(CLASSES, ["--train_task_config", two_sources, "--train_datasets", "a.jsonl", "--output_dir", str(tmp_path)])
    # PaddleNLP's default "" means no task file
    _, data, _ = parse_arguments(CLASSES, ["--ptx_task_config", "", "--output_dir", str(tmp_path / "p")])
    assert data.ptx_datasets == []


@pytest.mark.parametrize("entries, problem", [
    ([{"filepath": "missing.jsonl", "prob": 1}], "entry 0: filepath 'missing.jsonl' is not a file"),
    ([{"task_name": "x", "filepath": "a.jsonl", "prob": "high"}], "entry 0 ('x'): prob must be a number >= 0, got 'high'"),
    ([{"path": "a.jsonl"}], "entry 0: keys are filepath, prob, task_name (filepath required), got ['path']"),
    ({"filepath": "a.jsonl"}, 'expected a JSON list of {"filepath", "prob"} objects'),
    ([{"filepath": "a.jsonl", "prob": 0}], "every source has prob 0"),
])
def test_bad_task_files_name_the_file_and_entry(tmp_path, entries, problem):
    write_jsonl(tmp_path / "a.jsonl", "a", 3)
    task = write_task_file(tmp_path / "task.json", entries)
    with pytest.raises(ArgumentError) as info:
        parse_arguments(CLASSES, ["--train_task_config", task, "--output_dir", str(tmp_path / "o")])
    assert f"{task}: {problem}" in str(info.value)


@pytest.mark.parametrize("name, text, problem", [
    ("bad.json", '[{"src": ["a"]}, oops]', "entry 0 ('bad'): {source} does not hold UTF-8 JSON records"),
    ("latin.jsonl", b"\xff\xfe not utf-8\n", "entry 0 ('bad'): {source} does not hold UTF-8 JSON records"),
])
def test_an_unreadable_source_names_the_task_file_entry_and_source(tmp_path, name, text, problem):
    source = tmp_path / name
    source.write_bytes(text if isinstance(text, bytes) else text.encode())
    task = write_task_file(tmp_path / "task.json", [{"task_name": "bad", "filepath": str(source), "prob": 1}])
    with pytest.raises(ArgumentError) as info:
        parse_arguments(CLASSES, ["--train_task_config", task, "--output_dir", str(tmp_path / "o")])
    assert f"{task}: {problem.format(source=source)}" in str(info.value)


def test_a_negative_prob_names_the_task_file_and_entry(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", "a", 3)
    task = write_task_file(tmp_path / "task.json", [{"filepath": "a.jsonl", "prob": 1}, {"filepath": "a.jsonl", "prob": -0.5}])
    with pytest.raises(ArgumentError) as info:
        parse_arguments(CLASSES, ["--train_task_config", task, "--output_dir", str(tmp_path / "o")])
    assert f"{task}: entry 1: prob must be a number >= 0, got -0.5" in str(info.value)


def test_sft_and_online_dpo_read_task_files_too(two_sources, tmp_path):
    """docs/data.md: the train and eval task files also feed SFT and online DPO (src/tgt records)."""
    from dpo import online_dpo_arguments as online
    from sft import sft_arguments as sft

    expected = task_file_specs(two_sources)
    for classes in ((sft.ModelArgument, sft.DataArgument, sft.SFTTrainingArguments),
                    (online.ModelArgument, online.DataArgument, online.OnlineDPOTrainingArguments)):
        _, data, _ = parse_arguments(classes, ["--train_task_config", two_sources, "--eval_task_config", two_sources,
                                               "--output_dir", str(tmp_path / "o"), "--max_steps", "1"])
        assert data.train_datasets == expected and data.eval_datasets == expected
