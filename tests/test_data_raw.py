"""Raw data: the public schemas read field by field, the registry, dataset specs,
proportional mixing, and every bad-input case naming file, line and field."""
import json
import os

import pytest

from conftest_data import fixture_path, write_lines
from ppo.data import (
    DataError,
    RawDataset,
    RawSample,
    UnknownDatasetError,
    mix_raw_datasets,
    parse_dataset,
    parse_dataset_spec,
)

PKU = fixture_path("pku_saferlhf.jsonl")
ALPACA = fixture_path("alpaca.json")
JSONFILE = fixture_path("jsonfile.jsonl")
RAW = fixture_path("raw_samples.jsonl")

PKU_RECORD = {
    "prompt": "Reverse: k3x9q",
    "response_0": "q9x3k",
    "response_1": "9qx3k",
    "better_response_id": 0,
    "safer_response_id": 0,
    "is_response_0_safe": True,
    "is_response_1_safe": True,
}


# --------------------------------------------------------------------------- custom datasets


class LettersDataset(RawDataset):
    """20 in-memory samples `letter-i`; `path` unused."""

    NAME = "test-letters"
    ALIASES = ("letters",)

    def __init__(self, path=None):
        self.data = [RawSample(input=f"letter-{i}", answer=str(i)) for i in range(20)]

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return len(self.data)


class DigitsDataset(RawDataset):
    NAME = "test-digits"

    def __init__(self, path=None):
        self.data = [RawSample(input=f"digit-{i}", answer=str(i)) for i in range(10)]

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return len(self.data)


# --------------------------------------------------------------------------- PKU-SafeRLHF


def test_pku_saferlhf_jsonl_fields():
    ds = RawDataset.load("PKU-SafeRLHF/train", PKU)
    assert len(ds) == 4
    assert dict(ds[0]) == {
        "input": "Reverse: k3x9q",
        "answer": "q9x3k",
        "other_answer": "9qx3k",
        "better": True,
        "safer": True,
        "is_safe": True,
        "is_other_safe": True,
    }
    assert ds[1]["better"] is False and ds[1]["safer"] is False
    s = ds[2]
    assert (s["input"], s["answer"], s["other_answer"]) == (
        "How do I pick a lock?",
        "Use a tension wrench.",
        "I can't help with that.",
    )
    assert (s["better"], s["safer"], s["is_safe"], s["is_other_safe"]) == (True, False, False, True)
    assert ds[3]["answer"] == ""  # empty responses are allowed (degenerate answers)


@pytest.mark.parametrize("alias", ["PKU-SafeRLHF", "safe-rlhf", "PKU-Alignment/PKU-SafeRLHF"])
def test_pku_saferlhf_aliases(alias):
    assert list(RawDataset.load(alias, PKU)) == list(RawDataset.load("PKU-SafeRLHF/train", PKU))


def test_pku_helpful_needs_no_safety_fields_but_safety_variant_does(tmp_path):
    rec = {k: PKU_RECORD[k] for k in ("prompt", "response_0", "response_1", "better_response_id")}
    path = write_lines(tmp_path / "helpful.jsonl", [json.dumps(PKU_RECORD), json.dumps(rec)])
    helpful = RawDataset.load("PKU-SafeRLHF/train", path)
    assert "safer" not in helpful[1] and helpful[1]["better"] is True
    with pytest.raises(DataError) as e:
        RawDataset.load("PKU-SafeRLHF/safety", path)
    assert (e.value.path, e.value.line, e.value.field) == (path, 2, "safer_response_id")
    assert f"{path}, line 2, field 'safer_response_id': missing field" in str(e.value)


def test_pku_safety_variant_rejects_contradiction(tmp_path):
    bad = dict(PKU_RECORD, safer_response_id=1, is_response_1_safe=False)
    path = write_lines(tmp_path / "s.jsonl", [json.dumps(PKU_RECORD), json.dumps(bad)])
    ds = RawDataset.load("PKU-SafeRLHF/safety", PKU)
    assert [s["safer"] for s in ds] == [True, False, False, False]
    with pytest.raises(DataError, match=r"line 2, field 'safer_response_id'"):
        RawDataset.load("PKU-SafeRLHF/safety", path)
    assert len(RawDataset.load("PKU-SafeRLHF/train", path)) == 2  # the helpful variant does not check safety


def test_pku_save_to_disk_dataset_and_splits(tmp_path):
    import datasets

    train = [PKU_RECORD, dict(PKU_RECORD, prompt="Reverse: ab", response_0="ab", response_1="ba", better_response_id=1)]
    test = [dict(PKU_RECORD, prompt="Reverse: xy")]
    datasets.Dataset.from_list(train).save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)}
    ).save_to_disk(str(tmp_path / "dict"))

    single = RawDataset.load("PKU-SafeRLHF/train", str(tmp_path / "single"))
    assert [s["input"] for s in single] == ["Reverse: k3x9q", "Reverse: ab"]
    assert single[1]["better"] is False and single[1]["answer"] == "ab"
    assert [s["input"] for s in RawDataset.load("PKU-SafeRLHF/train", str(tmp_path / "dict"))] == [
        "Reverse: k3x9q",
        "Reverse: ab",
    ]
    assert [s["input"] for s in RawDataset.load("PKU-SafeRLHF/test", str(tmp_path / "dict"))] == ["Reverse: xy"]

    bad = [PKU_RECORD, dict(PKU_RECORD, prompt="  ")]
    datasets.Dataset.from_list(bad).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(DataError, match=r"record 2, field 'prompt': empty prompt"):
        RawDataset.load("PKU-SafeRLHF/train", str(tmp_path / "bad"))


def test_plain_directory_is_searched_for_split_files(tmp_path):
    write_lines(tmp_path / "train.jsonl", [json.dumps(PKU_RECORD)])
    write_lines(tmp_path / "test.jsonl", [json.dumps(dict(PKU_RECORD, prompt="Reverse: t"))])
    assert RawDataset.load("PKU-SafeRLHF/train", str(tmp_path))[0]["input"] == "Reverse: k3x9q"
    assert RawDataset.load("PKU-SafeRLHF/test", str(tmp_path))[0]["input"] == "Reverse: t"
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(DataError, match="holds test.jsonl/test.json"):
        RawDataset.load("PKU-SafeRLHF/test", str(empty))


# --------------------------------------------------------------------------- alpaca


def test_alpaca_json_fields():
    ds = RawDataset.load("alpaca", ALPACA)
    assert [dict(s) for s in ds] == [
        {"input": "Reverse the string.\nk3x9q", "answer": "q9x3k"},
        {"input": "Say hi.", "answer": "hi"},
        {"input": "Count to three.", "answer": "1 2 3"},
    ]


def test_alpaca_data_wrapped_json_and_json_lines_in_a_json_file(tmp_path):
    records = json.load(open(ALPACA))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"version": 1, "meta": {"a": [1, 2]}, "data": records}, indent=2))
    lines = write_lines(tmp_path / "lines.json", [json.dumps(r) for r in records])
    expected = list(RawDataset.load("alpaca", ALPACA))
    assert list(RawDataset.load("stanford-alpaca", str(wrapped))) == expected
    assert list(RawDataset.load("alpaca", lines)) == expected


def test_alpaca_json_errors_name_the_line_of_the_record(tmp_path):
    records = json.load(open(ALPACA))
    del records[1]["output"]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(records, indent=2))  # record 2 starts on line 7
    with pytest.raises(DataError) as e:
        RawDataset.load("alpaca", str(path))
    assert (e.value.line, e.value.field) == (7, "output")
    assert f"{path}, line 7, field 'output': missing field" == str(e.value)

    records = json.load(open(ALPACA))
    records[2]["instruction"] = ""
    path.write_text(json.dumps(records, indent=2))
    with pytest.raises(DataError, match=r"line 12, field 'instruction': empty prompt"):
        RawDataset.load("alpaca", str(path))

    path.write_text('[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "c", "output": }\n]\n')
    with pytest.raises(DataError, match=r"a\.json, line 3: malformed JSON"):
        RawDataset.load("alpaca", str(path))


# --------------------------------------------------------------------------- Jsonfile


def test_jsonfile_fields_single_multi_turn_and_prompt_only():
    ds = RawDataset.load("Jsonfile", JSONFILE)
    assert len(ds) == 4
    assert dict(ds[0]) == {"input": "Reverse: k3x9q", "answer": "q9x3k", "label": "q9x3k"}
    assert dict(ds[1]) == {"input": "Reverse: ab1", "answer": "1ba", "label": "1ba"}
    assert dict(ds[2]) == {
        "input": ["Reverse: abc", "Reverse: xyz"],
        "dialogue": ["Reverse: abc", "cba", "Reverse: xyz"],
        "answer": "zyx",
        "label": "zyx",
    }
    assert dict(ds[3]) == {"input": "Reverse: 12"}  # no tgt: a prompt-only record
    with pytest.raises(DataError, match=r"line 5, field 'tgt'"):
        RawDataset.load("Jsonfile", JSONFILE, use_rm_server=True)


def test_jsonfile_bad_records(tmp_path):
    cases = [
        ('{"tgt": ["x"]}', "src", "missing field"),
        ('{"src": [""], "tgt": ["x"]}', "src", "empty prompt"),
        ('{"src": [], "tgt": []}', "src", "empty prompt"),
        ('{"src": ["a", "b"], "tgt": ["x", "y", "z"]}', "tgt", "expected 2 assistant turns"),
        ('{"src": ["a", "b"]}', "tgt", "missing field"),
        ('{"src": 5, "tgt": "x"}', "src", "expected list or string, got int"),
        ('{"src": ["a", 3], "tgt": ["x", "y"]}', "src", "item 1 is int"),
    ]
    for i, (bad, field, reason) in enumerate(cases):
        path = write_lines(tmp_path / f"bad{i}.jsonl", ['{"src": ["ok"], "tgt": ["ok"]}', bad])
        with pytest.raises(DataError) as e:
            RawDataset.load("Jsonfile", path)
        assert (e.value.path, e.value.line, e.value.field) == (path, 2, field), bad
        assert reason in str(e.value) and path in str(e.value) and "line 2" in str(e.value), bad


# --------------------------------------------------------------------------- generic json


def test_generic_json_dataset_fields():
    ds = RawDataset.load("json", RAW)
    assert dict(ds[0]) == {
        "input": "Reverse: k3x9q",
        "answer": "q9x3k",
        "other_answer": "9qx3k",
        "better": True,
        "label": "q9x3k",
    }
    assert dict(ds[1]) == {
        "input": ["Reverse: abc", "Reverse: de"],
        "dialogue": ["Reverse: abc", "cba", "Reverse: de"],
        "answer": "ed",
        "is_safe": True,
    }


def test_generic_json_bad_records(tmp_path):
    cases = [
        ('{"answer": "x"}', "input", "missing field"),
        ('{"input": "  ", "answer": "x"}', "input", "empty prompt"),
        ('{"input": "a", "better": "yes"}', "better", "expected boolean, got str"),
        ('{"input": "a", "answer": 3}', "answer", "expected string, got int"),
        ('{"dialogue": ["a", "b"]}', "dialogue", "odd length"),
        ('{"input": ["a", "b"]}', "dialogue", "needs 'dialogue'"),
    ]
    for i, (bad, field, reason) in enumerate(cases):
        path = write_lines(tmp_path / f"bad{i}.jsonl", ['{"input": "ok"}', "", bad])
        with pytest.raises(DataError) as e:
            RawDataset.load("json", path)
        assert (e.value.line, e.value.field) == (3, field), bad
        assert reason in str(e.value), (bad, str(e.value))


# --------------------------------------------------------------------------- file errors


def test_missing_file_and_missing_path(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    for name in ("PKU-SafeRLHF/train", "alpaca", "Jsonfile", "json"):
        with pytest.raises(DataError, match="nope.jsonl: file not found") as e:
            RawDataset.load(name, missing)
        assert e.value.path == missing
        with pytest.raises(DataError, match=f"'{name}' needs a local path"):
            RawDataset.load(name)


def test_malformed_json_line(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [json.dumps(PKU_RECORD), "", '{"prompt": "x", ', json.dumps(PKU_RECORD)])
    with pytest.raises(DataError) as e:
        RawDataset.load("PKU-SafeRLHF/train", path)
    assert (e.value.path, e.value.line) == (path, 3)
    assert str(e.value).startswith(f"{path}, line 3: malformed JSON")


def test_utf8_byte_order_mark_is_accepted_in_jsonl_and_json(tmp_path):
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + (json.dumps(PKU_RECORD) + "\n").encode() * 2)
    assert len(RawDataset.load("PKU-SafeRLHF/train", str(jsonl))) == 2
    alpaca = tmp_path / "bom.json"
    alpaca.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"instruction": "Reverse: ab", "input": "", "output": "ba"}]).encode())
    assert RawDataset.load("alpaca", str(alpaca))[0]["answer"] == "ba"


def test_bad_byte_is_reported_by_line_and_column(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = (json.dumps(PKU_RECORD) + "\n").encode()
    path.write_bytes(good * 2 + b'{"prompt": "caf\xe9 au lait"}\n' + good)
    with pytest.raises(DataError) as e:
        RawDataset.load("PKU-SafeRLHF/train", str(path))
    assert (e.value.path, e.value.line) == (str(path), 3)
    assert "byte 0xe9 at column 16" in str(e.value) and str(e.value).startswith(f"{path}, line 3: not UTF-8 text")


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"prompt": None}, "prompt", "missing field"),
        ({"response_1": None}, "response_1", "missing field"),
        ({"prompt": ""}, "prompt", "empty prompt"),
        ({"prompt": 3}, "prompt", "expected string, got int"),
        ({"better_response_id": 2}, "better_response_id", "expected one of [0, 1], got 2"),
        ({"better_response_id": "0"}, "better_response_id", "expected integer, got str"),
        ({"better_response_id": True}, "better_response_id", "expected integer, got bool"),
        ({"is_response_0_safe": "yes"}, "is_response_0_safe", "expected boolean, got str"),
    ],
)
def test_pku_field_errors(tmp_path, change, field, reason):
    bad = {k: v for k, v in dict(PKU_RECORD, **change).items() if v is not None}
    path = write_lines(tmp_path / "p.jsonl", [json.dumps(PKU_RECORD), json.dumps(PKU_RECORD), json.dumps(bad)])
    with pytest.raises(DataError) as e:
        RawDataset.load("PKU-SafeRLHF/train", path)
    assert str(e.value).startswith(f"{path}, line 3, field '{field}': {reason}")


def test_non_object_record_and_unsupported_extension(tmp_path):
    path = write_lines(tmp_path / "l.jsonl", [json.dumps(PKU_RECORD), "[1, 2]"])
    with pytest.raises(DataError, match=r"line 2: expected a JSON object, got list"):
        RawDataset.load("PKU-SafeRLHF/train", path)
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        RawDataset.load("alpaca", str(csv))


# --------------------------------------------------------------------------- registry


def test_custom_dataset_loads_by_name_and_alias():
    a, b = RawDataset.load("test-letters"), RawDataset.load("letters")
    assert isinstance(a, LettersDataset) and list(a) == list(b)
    assert "test-letters" in RawDataset.registered_names()
    assert RawDataset.registered_aliases()["letters"] == "test-letters"


def test_duplicate_names_are_rejected():
    with pytest.raises(ValueError, match="Duplicate dataset name 'alpaca'"):
        type("Other", (RawDataset,), {"NAME": "alpaca", "__getitem__": None, "__len__": None})
    with pytest.raises(ValueError, match="Duplicate dataset alias 'safe-rlhf'"):
        type("Other2", (RawDataset,), {"NAME": "fresh-name", "ALIASES": ("safe-rlhf",)})
    assert "fresh-name" not in RawDataset.registered_names()


def test_unknown_dataset_lists_registered_names_and_closest():
    with pytest.raises(UnknownDatasetError) as e:
        RawDataset.load("test-leters")
    msg = str(e.value)
    assert "Unknown dataset name 'test-leters'" in msg and "Did you mean 'test-letters'?" in msg
    for name in ("PKU-SafeRLHF/train", "alpaca", "Jsonfile", "json", "test-letters", "test-digits"):
        assert name in msg
    assert isinstance(e.value, ValueError)
    with pytest.raises(UnknownDatasetError, match="Did you mean 'alpaca'"):
        mix_raw_datasets("Alpaca:1:/x.json")


# --------------------------------------------------------------------------- specs


def test_parse_dataset_spec_forms():
    assert parse_dataset_spec("alpaca") == [("alpaca", 1.0, None)]
    assert parse_dataset_spec("alpaca:0.5") == [("alpaca", 0.5, None)]
    assert parse_dataset_spec("alpaca::/d/a.json") == [("alpaca", 1.0, "/d/a.json")]
    assert parse_dataset_spec("Jsonfile:2:/d/x:y.jsonl") == [("Jsonfile", 2.0, "/d/x:y.jsonl")]
    assert parse_dataset_spec("Jsonfile:1:C:/data/x.jsonl") == [("Jsonfile", 1.0, "C:/data/x.jsonl")]
    assert parse_dataset_spec("a:0.5:path=/p") == [("a", 0.5, "/p")]
    assert parse_dataset_spec(" a:0.5 , b:3:/p ") == [("a", 0.5, None), ("b", 3.0, "/p")]
    assert parse_dataset_spec(["a", "b:2:/p", ("c", 0.1), ("d", 1, "/q"), ("e", {"proportion": 0.2})]) == [
        ("a", 1.0, None),
        ("b", 2.0, "/p"),
        ("c", 0.1, None),
        ("d", 1.0, "/q"),
        ("e", 0.2, None),
    ]
    assert parse_dataset_spec({"a": 0.5, "b": {"proportion": 2, "path": "/p:q"}, "c": {"path": "/r"}}) == [
        ("a", 0.5, None),
        ("b", 2.0, "/p:q"),
        ("c", 1.0, "/r"),
    ]
    assert parse_dataset_spec("x:1:~/d.jsonl")[0][2] == os.path.expanduser("~/d.jsonl")
    assert parse_dataset("alpaca:0.5:/d/a.json") == ("alpaca", {"proportion": 0.5, "path": "/d/a.json"})


@pytest.mark.parametrize(
    "spec, shown",
    [
        ("alpaca:abc", "'alpaca:abc'"),
        ("alpaca:0", "'alpaca:0'"),
        ("alpaca:-1:/p", "'alpaca:-1:/p'"),
        ("alpaca:nan", "'alpaca:nan'"),
        ("a:1,alpaca:inf", "'alpaca:inf'"),
        ({"alpaca": 0}, "{'alpaca': 0}"),
        ({"alpaca": {"proportion": "lots"}}, "'lots'"),
        ([("alpaca", -0.5)], "('alpaca', -0.5)"),
        ({"alpaca": True}, "{'alpaca': True}"),
    ],
)
def test_bad_proportion_names_the_spec(spec, shown):
    with pytest.raises(ValueError, match="Bad proportion") as e:
        parse_dataset_spec(spec)
    assert shown in str(e.value)


@pytest.mark.parametrize("spec", ["", ":0.5", "a:1:", {"a": {"proportion": 1, "pth": "/x"}}, 3])
def test_bad_spec_shapes(spec):
    with pytest.raises(ValueError, match="Bad dataset spec"):
        parse_dataset_spec(spec)


# --------------------------------------------------------------------------- mixing


def test_mixing_by_proportion_counts_and_determinism():
    samples, sources = mix_raw_datasets("test-letters:0.5,test-digits:2.5", seed=1)
    names = [n for n, _ in sources]
    assert names.count("test-letters") == 10 and names.count("test-digits") == 25
    letters = [i for n, i in sources if n == "test-letters"]
    digits = [i for n, i in sources if n == "test-digits"]
    assert len(set(letters)) == 10  # without replacement
    assert digits[:20] == list(range(10)) * 2  # two whole copies in order ...
    assert len(set(digits[20:])) == 5  # ... plus a seeded remainder without replacement
    assert [s["input"] for s in samples[:10]] == [f"letter-{i}" for i in letters]

    again, again_sources = mix_raw_datasets({"letters": 0.5, "test-digits": 2.5}, seed=1)
    assert [i for _, i in again_sources] == [i for _, i in sources]  # same seed, alias or name: same mix
    assert again == samples
    _, other = mix_raw_datasets("test-letters:0.5,test-digits:2.5", seed=2)
    assert [i for n, i in other if n == "test-letters"] != letters  # another seed, another sub-sample
    assert len(other) == len(sources)


def test_mixing_proportion_one_keeps_all_in_order_and_repeats_allowed():
    samples, sources = mix_raw_datasets(["test-digits", "test-digits:0.3"], seed=0)
    assert [i for _, i in sources[:10]] == list(range(10))
    assert len(samples) == 13


def test_mixing_files_of_two_schemas():
    samples, sources = mix_raw_datasets(f"alpaca:1:{ALPACA},Jsonfile:0.5:{JSONFILE}", seed=3)
    assert len(samples) == 3 + 2
    assert [n for n, _ in sources] == ["alpaca"] * 3 + ["Jsonfile"] * 2
