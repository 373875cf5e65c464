"""Ranked, unpaired and rejected-only preference data: the readers (PaddleNLP's DPO format with
k responses, PaddleNLP's KTO records, TRL's prompt/completion/label, our json), their errors
(file, line, field), the answer-set datasets and collators."""
import json

import numpy as np
import pytest

from conftest_data import tiny_tokenizer  # noqa: F401
from dpo.dpo_trainer import UnpairedKTOCollator
from ppo.data import (
    IGNORE_INDEX,
    DataError,
    RankedPreferenceDataset,
    RawDataset,
    RejectedOnlyDataset,
    UnpairedPreferenceDataset,
)

TEMPLATE = "USER: {input} ASSISTANT:"


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


def test_paddlenlp_ranked_and_unpaired_records(tmp_path):
    ranked = write_jsonl(tmp_path / "r.jsonl", [
        {"src": "q", "tgt": [], "response": ["mid", "best", "worst"], "sort": [1, 2, 0]},
        {"src": ["q1", "q2"], "tgt": ["a1"], "response": ["x", "y"], "sort": [0.5, 0.25]},
    ])
    samples = list(RawDataset.load("paddlenlp-ranked", ranked))
    assert samples[0]["answers"] == ["mid", "best", "worst"] and samples[0]["answer_scores"] == [1.0, 2.0, 0.0]
    assert samples[1]["dialogue"] == ["q1", "a1", "q2"] and samples[1]["answer_scores"] == [0.5, 0.25]
    unpaired = write_jsonl(tmp_path / "u.jsonl", [
        {"src": "q", "tgt": [], "response": ["good"], "sort": [1]},
        {"src": "q", "tgt": [], "response": ["bad"], "sort": [0]},
    ])
    assert [(s["answer"], s["desirable"]) for s in RawDataset.load("paddlenlp-unpaired", unpaired)] == [("good", True), ("bad", False)]


def test_trl_unpaired_and_json_records(tmp_path):
    trl = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "p", "completion": "c", "label": False}])
    assert list(RawDataset.load("trl-kto", trl)) == [{"input": "p", "answer": "c", "desirable": False}]
    raw = write_jsonl(tmp_path / "j.jsonl", [
        {"input": "p", "answers": ["a", "b", "c"], "answer_scores": [0, 3, 1]},
        {"input": "p", "answer": "a", "desirable": True},
    ])
    samples = list(RawDataset.load("json", raw))
    assert samples[0]["answers"] == ["a", "b", "c"] and samples[0]["answer_scores"] == [0.0, 3.0, 1.0]
    assert samples[1]["desirable"] is True


@pytest.mark.parametrize(
    "name, record, field, reason",
    [
        ("paddlenlp-ranked", {"src": "q", "tgt": [], "response": ["a"], "sort": [1]}, "response", "k >= 2 answers"),
        ("paddlenlp-ranked", {"src": "q", "tgt": [], "response": ["a", "b", "c"], "sort": [1, 0]}, "sort", "expected 3 numbers"),
        ("paddlenlp-ranked", {"src": "q", "tgt": [], "response": ["a", "b"], "sort": [1, 1]}, "sort", "all 2 scores are equal"),
        ("paddlenlp-ranked", {"src": "q", "tgt": [], "response": ["a", " "], "sort": [1, 0]}, "response", "answer 1 is empty"),
        ("paddlenlp-unpaired", {"src": "q", "tgt": [], "response": ["a", "b"], "sort": [1]}, "response", "one non-empty"),
        ("paddlenlp-unpaired", {"src": "q", "tgt": [], "response": ["a"], "sort": [2]}, "sort", "[1] (desirable)"),
        ("trl-unpaired", {"prompt": "p", "completion": "c"}, "label", "missing field"),
        ("trl-unpaired", {"prompt": "p", "completion": " ", "label": True}, "completion", "empty"),
        ("json", {"input": "p", "answers": ["a", "b"]}, "answer_scores", "missing field"),
        ("json", {"input": "p", "answers": ["a", "b"], "answer_scores": [1, True]}, "answer_scores", "expected 2 numbers"),
    ],
)
def test_bad_records_name_file_line_field(tmp_path, name, record, field, reason):
    good = {"paddlenlp-ranked": {"src": "q", "tgt": [], "response": ["a", "b"], "sort": [1, 0]},
            "paddlenlp-unpaired": {"src": "q", "tgt": [], "response": ["a"], "sort": [1]},
            "trl-unpaired": {"prompt": "p", "completion": "c", "label": True},
            "json": {"input": "p", "answer": "a"}}[name]
    path = write_jsonl(tmp_path / "bad.jsonl", [good, record])
    with pytest.raises(DataError) as info:
        RawDataset.load(name, path)
    message = str(info.value)
    assert path in message and "line 2" in message and f"'{field}'" in message and reason in message, message


def test_pair_reader_points_to_the_other_readers(tmp_path):
    path = write_jsonl(tmp_path / "k.jsonl", [{"src": "q", "tgt": [], "response": ["a", "b", "c"], "sort": [2, 1, 0]}])
    with pytest.raises(DataError, match="'paddlenlp-ranked'"):
        RawDataset.load("paddlenlp-dpo", path)


def test_answer_set_datasets_and_collator(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    path = write_jsonl(tmp_path / "j.jsonl", [
        {"input": "ab", "answers": ["x", "yy", "z"], "answer_scores": [0, 3, 1]},
        {"input": "cd", "answers": ["u", "v"], "answer_scores": [1, 2]},
    ])
    ds = RankedPreferenceDataset(f"json:1:{path}", tok, max_length=32, prompt_template=TEMPLATE)
    assert list(ds[0]["scores"]) == [3.0, 1.0, 0.0] and list(ds[1]["scores"]) == [2.0, 1.0]
    answer = lambda item, k: list(item["input_ids"][k][item["labels"][k] != IGNORE_INDEX])  # noqa: E731
    assert answer(ds[0], 0) == list(tok("yy", add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    batch = ds.get_collator()([ds[0], ds[1]])
    assert batch["input_ids"].shape[0] == 6 and batch["scores"].shape == [2, 3]
    np.testing.assert_array_equal(batch["valid"].numpy(), [[1, 1, 1], [1, 1, 0]])
    labels = batch["labels"].numpy()
    assert (labels[2 * 2 + 1] == IGNORE_INDEX).all()  # prompt 1 has no third answer: no answer tokens
    width = len(ds[1]["input_ids"][1])
    np.testing.assert_array_equal(batch["input_ids"].numpy()[1 * 2 + 1, :width], ds[1]["input_ids"][1])


def test_unpaired_rejected_and_kl_pairs(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": p, "completion": c, "label": d}
                                              for p, c, d in (("ab", "x", True), ("cd", "y", False), ("ef", "z", False))])
    kw = dict(max_length=32, prompt_template=TEMPLATE)
    unpaired = UnpairedPreferenceDataset(f"trl-unpaired:1:{path}", tok, **kw)
    assert [float(unpaired[i]["scores"][0]) for i in range(3)] == [1.0, 0.0, 0.0]
    rejected = RejectedOnlyDataset(f"trl-unpaired:1:{path}", tok, **kw)
    assert len(rejected) == 2 and rejected.stats["skipped_desirable"] == 1
    batch = UnpairedKTOCollator(unpaired.get_collator(), max_length=32)([unpaired[i] for i in range(3)])
    kl_ids, kl_labels = batch["kl_input_ids"].numpy(), batch["kl_labels"].numpy()
    for j in range(3):  # example j: its own prompt, the completion of example j - 1
        ids, labels = unpaired[j]["input_ids"][0], unpaired[j]["labels"][0]
        prev_ids, prev_labels = unpaired[j - 1]["input_ids"][0], unpaired[j - 1]["labels"][0]
        expected = np.concatenate([ids[labels == IGNORE_INDEX], prev_ids[prev_labels != IGNORE_INDEX]])
        np.testing.assert_array_equal(kl_ids[j, : len(expected)], expected)
        assert list(kl_labels[j][kl_labels[j] != IGNORE_INDEX]) == list(prev_ids[prev_labels != IGNORE_INDEX])


def test_a_dataset_of_the_wrong_kind_names_both(tmp_path, tiny_tokenizer):
    path = write_jsonl(tmp_path / "j.jsonl", [{"input": "ab", "answers": ["x", "y"], "answer_scores": [0, 1]}])
    with pytest.raises(ValueError, match="UnpairedPreferenceDataset reads unpaired records; this record holds lists"):
        UnpairedPreferenceDataset(f"json:1:{path}", tiny_tokenizer, max_length=32, prompt_template=TEMPLATE)
