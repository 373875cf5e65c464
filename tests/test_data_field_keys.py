"""`prompt_key` / `response_key` (PaddleNLP's and verl's names for the prompt data's fields):
every reader either reads its prompt / reference-answer field from the named key, giving the
same samples as the file with the format's own names, or refuses the key by name; the PPO and
online DPO entry points hand the keys to their train and eval prompts (not to ptx data)."""
import json

import pytest

from conftest_data import tiny_tokenizer  # noqa: F401
from ppo.data import DataError, JsonDataset, LocalFileDataset, PromptOnlyDataset, RawDataset

SAFETY = {"safer_response_id": 0, "is_response_0_safe": True, "is_response_1_safe": False}
PKU = {"prompt": "Reverse: ab", "response_0": "ba", "response_1": "ab", "better_response_id": 0}
USER, ASSISTANT = {"role": "user", "content": "Reverse: ab"}, {"role": "assistant", "content": "ba"}
EXAMPLES = {  # one valid record of each registered local format, in the format's own field names
    "Jsonfile": {"src": ["Reverse: ab", "And cd?"], "tgt": ["ba", "dc"]},
    "json": {"input": "Reverse: ab", "answer": "ba", "label": "ba"},
    "alpaca": {"instruction": "Reverse", "input": "ab", "output": "ba"},
    "PKU-SafeRLHF/train": PKU,
    "PKU-SafeRLHF/test": PKU,
    "PKU-SafeRLHF/safety": {**PKU, **SAFETY},
    "PKU-SafeRLHF/safety/test": {**PKU, **SAFETY},
    "paddlenlp-dpo": {"src": ["Reverse: ab"], "tgt": [], "response": ["ba", "ab"], "sort": [1, 0]},
    "paddlenlp-prm": {"input": "USER: Reverse: ab ASSISTANT:b|a|", "label": "USER: Reverse: ab ASSISTANT:b+a-"},
    "paddlenlp-ranked": {"src": "Reverse: ab", "response": ["ba", "bb", "ab"], "sort": [3, 2, 1]},
    "paddlenlp-unpaired": {"src": "Reverse: ab", "response": "ba", "sort": [1]},
    "trl-unpaired": {"prompt": "Reverse: ab", "completion": "ba", "label": True},
    "trl-preference": {"prompt": "Reverse: ab", "chosen": "ba", "rejected": "ab"},
    "trl-messages": {"messages": [USER, ASSISTANT]},
    "trl-prompt": {"prompt": [USER], "solution": "ba"},
}
def write_lines(path, records):
    """`records` as JSON lines in `path`; the path as a string."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


LOCAL_FORMATS = sorted(n for n, c in RawDataset._REGISTRY.items() if issubclass(c, LocalFileDataset))


def test_every_local_format_has_an_example():
    """A new reader must say here how it reads the keys (its FIELD_ROLES and an example record)."""
    assert sorted(EXAMPLES) == LOCAL_FORMATS


@pytest.mark.parametrize("name", LOCAL_FORMATS)
@pytest.mark.parametrize("role", ["prompt", "response"])
def test_key_renames_the_field_or_is_refused_by_name(name, role, tmp_path):
    """With the format's field moved to 'my_field', the key reads the same samples; a format
    without that field refuses `<role>_key` by name, listing the formats that take it."""
    cls = RawDataset.resolve(name)
    own = cls.FIELD_ROLES.get(role)
    native = write_lines(tmp_path / "native.jsonl", [EXAMPLES[name]])
    if own is None:
        with pytest.raises(DataError, match=rf"{role}_key 'my_field': dataset '{name}' has no single {role} field") as e:
            RawDataset.load(name, native, **{f"{role}_key": "my_field"})
        assert e.value.field == f"{role}_key" and "Jsonfile" in str(e.value)
        return
    record = dict(EXAMPLES[name])
    record["my_field"] = record.pop(own)
    renamed = write_lines(tmp_path / "renamed.jsonl", [record])
    expected = list(RawDataset.load(name, native))
    assert list(RawDataset.load(name, renamed, **{f"{role}_key": "my_field"})) == expected
    try:  # the format's own name is no longer read: a required field is missing, an optional one left out
        assert list(RawDataset.load(name, native, **{f"{role}_key": "my_field"})) != expected
    except DataError as e:
        assert e.field == "my_field" and e.line == 1 and e.reason.startswith("missing field")


def test_jsonfile_with_custom_keys_reads_prompt_answer_and_label(tmp_path):
    """`{"question", "solution"}` records read as Jsonfile's src / tgt: the prompt, and the final
    answer as both answer and label (what a reward server checks); errors name the file's keys."""
    path = write_lines(tmp_path / "qa.jsonl", [
        {"question": "Reverse: ab", "solution": "ba"},
        {"question": ["Reverse: ab", "And cd?"], "solution": ["ba", "dc"]},
    ])
    single, multi = JsonDataset(path, prompt_key="question", response_key="solution")
    assert single == {"input": "Reverse: ab", "answer": "ba", "label": "ba"}
    assert multi["dialogue"] == ["Reverse: ab", "ba", "And cd?"] and multi["label"] == "dc"
    bad = write_lines(tmp_path / "bad.jsonl", [{"question": "Reverse: ab", "solution": "ba"}, {"question": "x", "solution": ["a", "b"]}])
    with pytest.raises(DataError, match=r"line 2, field 'solution': expected 1 assistant turns \(one per 'question' turn\)"):
        JsonDataset(bad, prompt_key="question", response_key="solution")
    with pytest.raises(DataError, match="use_rm_server needs the final answer \\(the last 'solution' turn\\)"):
        JsonDataset(write_lines(tmp_path / "nolabel.jsonl", [{"question": ["x", "y"], "solution": ["z"]}]), use_rm_server=True,
                    prompt_key="question", response_key="solution")


def test_empty_key_is_refused(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", [EXAMPLES["Jsonfile"]])
    with pytest.raises(DataError, match="field 'prompt_key': expected a field name"):
        JsonDataset(path, prompt_key=" ")


def test_prompt_only_dataset_takes_the_keys(tiny_tokenizer, tmp_path):  # noqa: F811
    """The reward server's label comes from the response key; a record without it is named."""
    path = write_lines(tmp_path / "qa.jsonl", [{"question": "Reverse: ab", "solution": "ba"}, {"question": "Reverse: cd"}])
    ds = PromptOnlyDataset(f"Jsonfile:1:{path}", tiny_tokenizer, prompt_template="USER: {input} ASSISTANT:",
                           prompt_key="question", response_key="solution")
    assert [d["src"] for d in ds] == ["Reverse: ab", "Reverse: cd"] and [d["label"] for d in ds] == ["ba", None]
    assert ds[0]["prompt"] == "USER: Reverse: ab ASSISTANT:"
    with pytest.raises(ValueError, match=r"no reference answer \('solution', the response_key\)"):
        PromptOnlyDataset(f"Jsonfile:1:{path}", tiny_tokenizer, prompt_key="question", response_key="solution",
                          require_label=True)


@pytest.mark.parametrize("entry", ["ppo", "online_dpo"])
def test_entry_points_hand_the_keys_to_train_and_eval_prompts(entry, tiny_tokenizer, tmp_path):  # noqa: F811
    """The GRPO and online DPO configs' arguments with `--prompt_key question --response_key
    solution`: train and eval prompts read those fields (ptx data, alpaca here, keeps its own)."""
    from tests.test_argument_modules import ENTRY_CLASSES
    from ppo.common.argument_parsing import parse_arguments

    train = write_lines(tmp_path / "train.jsonl", [{"question": f"Reverse: {w}", "solution": w[::-1]} for w in ("ab", "cd")])
    test = write_lines(tmp_path / "test.jsonl", [{"question": "Reverse: ef", "solution": "fe"}])
    alpaca = tmp_path / "ptx.json"
    alpaca.write_text(json.dumps([{"instruction": "Reverse: gh", "output": "hg"}]))
    argv = [f"config/tiny/{'grpo' if entry == 'ppo' else 'online_dpo'}_argument.json", "--output_dir", str(tmp_path / "out"),
            "--train_datasets", f"Jsonfile:1:{train}", "--eval_datasets", f"Jsonfile:1:{test}",
            "--prompt_key", "question", "--response_key", "solution"]
    if entry == "ppo":
        argv += ["--ptx_datasets", f"alpaca:1:{alpaca}", "--ptx_coeff", "0.5"]
    _, data_args, training_args = parse_arguments(ENTRY_CLASSES[entry], argv)
    if entry == "ppo":
        from ppo.run_ppo import build_datasets

        train_ds, eval_ds, ptx = build_datasets(data_args, training_args, tiny_tokenizer, require_label=True)
        assert len(ptx) == 1
    else:
        from dpo.run_online_dpo import build_datasets

        train_ds, eval_ds = build_datasets(data_args, training_args, tiny_tokenizer, require_label=True)
    assert [(d["src"], d["label"]) for d in train_ds] == [("Reverse: ab", "ba"), ("Reverse: cd", "dc")]
    assert [(d["src"], d["label"]) for d in eval_ds] == [("Reverse: ef", "fe")]


def test_a_reader_that_takes_no_keys_is_refused_by_name(tiny_tokenizer):  # noqa: F811
    class InMemory(RawDataset):
        NAME = "test-in-memory-prompts"

        def __init__(self, path=None):
            self.rows = [{"input": "Reverse: ab"}]

        def __getitem__(self, i):
            return self.rows[i]

        def __len__(self):
            return 1

    try:
        assert [d["src"] for d in PromptOnlyDataset("test-in-memory-prompts", tiny_tokenizer)] == ["Reverse: ab"]
        with pytest.raises(DataError, match="dataset 'test-in-memory-prompts' \\(.*InMemory\\) does not read prompt_key"):
            PromptOnlyDataset("test-in-memory-prompts", tiny_tokenizer, prompt_key="question")
    finally:
        RawDataset._REGISTRY.pop("test-in-memory-prompts")
