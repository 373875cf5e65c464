"""Tokenised datasets and collators with the tiny tokenizer: prompt/answer ids,
label masks, padding sides, de-duplication, position ids, over-long rules.

Token counts with the tiny tokenizer and the demo template `USER: {input} ASSISTANT:`:
the prompt `Reverse: ` + n symbols is `<s> USER: ▁ Reverse: ▁ x1..xn ▁ ASSISTANT:`,
i.e. 7 + n tokens; an answer of m symbols is m + 1 tokens with EOS.
"""
import json

import numpy as np
import paddle
import pytest

from conftest_data import fixture_path, load_tiny_tokenizer, tiny_tokenizer, write_lines  # noqa: F401
from ppo.data import (
    DEFAULT_TEMPLATE,
    DEMO_TEMPLATE,
    IGNORE_INDEX,
    PreferenceDataset,
    PromptOnlyDataset,
    SafetyPreferenceDataset,
    SupervisedDataset,
    demo_dataset_specs,
    format_prompt,
)

PKU = fixture_path("pku_saferlhf.jsonl")
JSONFILE = fixture_path("jsonfile.jsonl")
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ bos_token }}USER: {{ m['content'] }} ASSISTANT:"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def ids(tokenizer, text, **kwargs):
    return list(tokenizer(text, **kwargs)["input_ids"])


def answer_ids(tokenizer, text):
    return ids(tokenizer, text, add_special_tokens=False) + [tokenizer.eos_token_id]


def jsonfile(tmp_path, records, name="d.jsonl"):
    return "Jsonfile:1:" + write_lines(tmp_path / name, [json.dumps(r) for r in records])


def raw_json(tmp_path, records, name="r.jsonl"):
    return "json:1:" + write_lines(tmp_path / name, [json.dumps(r) for r in records])


def reverse(s):
    return {"src": [f"Reverse: {s}"], "tgt": [s[::-1]]}


# --------------------------------------------------------------------------- prompts


def test_format_prompt_templates_and_history():
    assert format_prompt("hi") == "BEGINNING OF CONVERSATION: USER: hi ASSISTANT:"
    assert DEFAULT_TEMPLATE == "BEGINNING OF CONVERSATION: USER: {input} ASSISTANT:"
    assert format_prompt("Reverse: k3x9q", template=DEMO_TEMPLATE) == "USER: Reverse: k3x9q ASSISTANT:"
    assert (
        format_prompt("u2", template=DEMO_TEMPLATE, history=[("u0", "a0"), ("u1", "a1")])
        == "USER: u0 ASSISTANT:a0 USER: u1 ASSISTANT:a1 USER: u2 ASSISTANT:"
    )
    assert format_prompt("{x} {input}", template="Q: {input} A:") == "Q: {x} {input} A:"  # braces in text are safe
    with pytest.raises(ValueError, match="no '{input}' placeholder"):
        format_prompt("hi", template="USER: ASSISTANT:")


def test_chat_template(tmp_path, tiny_tokenizer):
    with pytest.raises(ValueError, match="has no chat template"):
        format_prompt("hi", tiny_tokenizer, use_chat_template=True)
    with pytest.raises(ValueError, match="has no chat template"):
        SupervisedDataset(jsonfile(tmp_path, [reverse("ab")]), tiny_tokenizer, use_chat_template=True)

    tok = load_tiny_tokenizer()  # a private copy: the session tokenizer stays template-free
    tok.init_chat_template(CHAT_TEMPLATE)
    text = format_prompt("Reverse: xy", tok, use_chat_template=True, history=[("Reverse: ab", "ba")])
    assert text == "<s>USER: Reverse: ab ASSISTANT:ba</s><s>USER: Reverse: xy ASSISTANT:"
    record = {"src": ["Reverse: ab", "Reverse: xy"], "tgt": ["ba", "yx"]}
    ds = SupervisedDataset(jsonfile(tmp_path, [record]), tok, use_chat_template=True)
    prompt = ids(tok, text, add_special_tokens=False)  # the template carries its own <s>
    assert prompt[0] == tok.bos_token_id and prompt.count(tok.bos_token_id) == 2
    assert ds[0]["input_ids"].tolist() == prompt + answer_ids(tok, "yx")


# --------------------------------------------------------------------------- supervised


def test_sft_demo_prompt_ids_and_labels(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    ds = SupervisedDataset(jsonfile(tmp_path, [reverse("k3x9q")]), tok, prompt_template=DEMO_TEMPLATE)
    prompt = ids(tok, "USER: Reverse: k3x9q ASSISTANT:")
    answer = answer_ids(tok, "q9x3k")
    assert prompt[0] == tok.bos_token_id and len(prompt) == 12
    assert answer[-1] == tok.eos_token_id and len(answer) == 6
    item = ds[0]
    assert item["input_ids"].tolist() == prompt + answer
    assert item["labels"].tolist() == [IGNORE_INDEX] * 12 + answer
    assert item["input_ids"].dtype == np.int64 and item["labels"].dtype == np.int64
    assert ds.stats == {"raw": 1, "dropped_prompt_too_long": 0, "truncated_answer": 0, "dropped_empty_answer": 0, "kept": 1}


def test_sft_default_template_and_multi_turn(tiny_tokenizer):
    tok = tiny_tokenizer
    ds = SupervisedDataset(f"json:1:{fixture_path('raw_samples.jsonl')}", tok, prompt_template=DEMO_TEMPLATE)
    multi = ids(tok, "USER: Reverse: abc ASSISTANT:cba USER: Reverse: de ASSISTANT:")
    assert ds[1]["input_ids"].tolist() == multi + answer_ids(tok, "ed")
    assert ds[1]["labels"].tolist() == [IGNORE_INDEX] * len(multi) + answer_ids(tok, "ed")
    beaver = SupervisedDataset(f"json:1:{fixture_path('raw_samples.jsonl')}", tok)
    assert beaver[0]["input_ids"].tolist()[: -6] == ids(tok, "BEGINNING OF CONVERSATION: USER: Reverse: k3x9q ASSISTANT:")


def test_sft_needs_answers(tiny_tokenizer):
    with pytest.raises(ValueError, match=r"needs field\(s\) \['answer'\], but .*jsonfile.jsonl, line 5 \(sample 3 of dataset 'Jsonfile'\)"):
        SupervisedDataset(f"Jsonfile:1:{JSONFILE}", tiny_tokenizer)


def test_sft_collator_right_pads(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    ds = SupervisedDataset(jsonfile(tmp_path, [reverse("ab"), reverse("k3x9q")]), tok, prompt_template=DEMO_TEMPLATE)
    lengths = [len(ds[0]["input_ids"]), len(ds[1]["input_ids"])]
    assert lengths == [9 + 3, 12 + 6]
    batch = ds.get_collator()([ds[0], ds[1]])
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    for key, value in batch.items():
        assert isinstance(value, paddle.Tensor) and value.dtype == paddle.int64 and value.shape == [2, 18], key
    input_ids, mask, labels = (batch[k].numpy() for k in ("input_ids", "attention_mask", "labels"))
    assert input_ids[0, :12].tolist() == ds[0]["input_ids"].tolist()
    assert input_ids[0, 12:].tolist() == [tok.pad_token_id] * 6  # right padding
    assert mask.tolist() == [[1] * 12 + [0] * 6, [1] * 18]
    assert labels[0].tolist() == [IGNORE_INDEX] * 9 + answer_ids(tok, "ba") + [IGNORE_INDEX] * 6
    assert labels[1].tolist() == ds[1]["labels"].tolist()
    np_batch = ds.get_collator(return_tensors="np")([ds[0], ds[1]])
    assert np_batch["labels"].dtype == np.int64 and (np_batch["labels"] == labels).all()


def test_sft_over_long_drop_and_truncation(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    # prompt lengths 9, 12, 15, 16, 17 (7 + n); answers n + 1 with EOS; max_length 16
    records = [reverse(s) for s in ("ab", "k3x9q", "abcdefgh", "abcdefghi", "abcdefghij")]
    ds = SupervisedDataset(jsonfile(tmp_path, records), tok, max_length=16, prompt_template=DEMO_TEMPLATE)
    assert ds.stats == {"raw": 5, "dropped_prompt_too_long": 2, "truncated_answer": 2, "dropped_empty_answer": 0, "kept": 3}
    fits, cut4, cut1 = (ds[i]["input_ids"].tolist() for i in range(3))
    assert len(fits) == 12 and fits[-1] == tok.eos_token_id  # whole answer fits: EOS kept
    assert cut4 == ids(tok, "USER: Reverse: k3x9q ASSISTANT:") + ids(tok, "q9x3", add_special_tokens=False)
    assert len(cut4) == 16 and tok.eos_token_id not in cut4  # truncated answers lose EOS
    assert len(cut1) == 16 and cut1[-1] == ids(tok, "h", add_special_tokens=False)[0]
    assert (ds[2]["labels"] != IGNORE_INDEX).sum() == 1

    exact = SupervisedDataset(jsonfile(tmp_path, [reverse("k3x9q")], "e.jsonl"), tok, max_length=18, prompt_template=DEMO_TEMPLATE)
    assert exact.stats["truncated_answer"] == 0 and exact[0]["input_ids"][-1] == tok.eos_token_id


# --------------------------------------------------------------------------- preference


def test_preference_pairs_follow_better(tiny_tokenizer):
    tok = tiny_tokenizer
    ds = PreferenceDataset(f"PKU-SafeRLHF:1:{PKU}", tok, prompt_template=DEMO_TEMPLATE)
    assert len(ds) == 4
    prompt = ids(tok, "USER: Reverse: k3x9q ASSISTANT:")
    assert ds[0]["better_input_ids"].tolist() == prompt + answer_ids(tok, "q9x3k")  # better_response_id 0
    assert ds[0]["worse_input_ids"].tolist() == prompt + answer_ids(tok, "9qx3k")
    assert ds[1]["better_input_ids"].tolist() == ids(tok, "USER: Reverse: ab1 ASSISTANT:") + answer_ids(tok, "1ba")
    assert ds[3]["worse_input_ids"].tolist() == ids(tok, "USER: Reverse: 77a ASSISTANT:") + [tok.eos_token_id]
    for item in (ds[0], ds[3]):
        for side in ("better", "worse"):
            labels, input_ids = item[f"{side}_labels"], item[f"{side}_input_ids"]
            n_prompt = int((labels == IGNORE_INDEX).sum())
            assert labels[:n_prompt].tolist() == [IGNORE_INDEX] * n_prompt
            assert labels[n_prompt:].tolist() == input_ids[n_prompt:].tolist()


def test_preference_collator_common_length(tiny_tokenizer):
    tok = tiny_tokenizer
    ds = PreferenceDataset(f"PKU-SafeRLHF:1:{PKU}", tok, prompt_template=DEMO_TEMPLATE)
    samples = [ds[0], ds[3]]
    batch = ds.get_collator()(samples)
    assert list(batch) == [
        "better_input_ids",
        "better_attention_mask",
        "better_labels",
        "worse_input_ids",
        "worse_attention_mask",
        "worse_labels",
    ]
    width = max(len(s[k]) for s in samples for k in ("better_input_ids", "worse_input_ids"))
    assert width == 18
    for key, value in batch.items():
        assert value.dtype == paddle.int64 and value.shape == [2, width], key
    worse = batch["worse_input_ids"].numpy()[1]
    n = len(ds[3]["worse_input_ids"])  # prompt + EOS only (empty answer)
    assert worse[:n].tolist() == ds[3]["worse_input_ids"].tolist()
    assert worse[n:].tolist() == [tok.pad_token_id] * (width - n)
    assert batch["worse_attention_mask"].numpy()[1].tolist() == [1] * n + [0] * (width - n)
    assert batch["worse_labels"].numpy()[1].tolist() == [IGNORE_INDEX] * (n - 1) + [tok.eos_token_id] + [
        IGNORE_INDEX
    ] * (width - n)


def test_empty_answers_are_dropped_with_counts_and_refused_when_none_remain(tmp_path, tiny_tokenizer, caplog):
    tok = tiny_tokenizer
    sft = [{"input": "Reverse: ab", "answer": "ba"}, {"input": "Reverse: abc", "answer": ""},
           {"input": "Reverse: k3x9q", "answer": "  "}]
    ds = SupervisedDataset(raw_json(tmp_path, sft), tok, max_length=32, prompt_template=DEMO_TEMPLATE)
    assert ds.stats["dropped_empty_answer"] == 2 and len(ds) == 1
    assert "2 samples had an empty answer and were dropped" in caplog.text
    pku = {"prompt": "Reverse: ab", "response_0": "", "response_1": "ab", "better_response_id": 0}
    path = write_lines(tmp_path / "pku.jsonl", [json.dumps(pku), json.dumps({**pku, "response_0": "ba", "response_1": ""}),
                                                json.dumps({**pku, "response_0": "ba"})])
    pairs = PreferenceDataset(f"PKU-SafeRLHF/train:1:{path}", tok, max_length=32, prompt_template=DEMO_TEMPLATE)
    assert pairs.stats["dropped_empty_answer"] == 1 and len(pairs) == 2  # an empty worse answer is a preference
    chosen_empty = write_lines(tmp_path / "empty.jsonl", [json.dumps({**pku, "prompt": f"Reverse: {c}"}) for c in "abc"])
    with pytest.raises(ValueError, match=r"has no samples: all 3 records were dropped \(dropped_empty_answer=3\)"):
        PreferenceDataset(f"PKU-SafeRLHF/train:1:{chosen_empty}", tok, max_length=32, prompt_template=DEMO_TEMPLATE)
    with pytest.raises(ValueError, match=r"dropped_empty_answer=1"):
        SupervisedDataset(raw_json(tmp_path, sft[1:2], name="e.jsonl"), tok, max_length=32, prompt_template=DEMO_TEMPLATE)


def test_preference_over_long_and_identical_pairs(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    records = [
        {"input": "Reverse: ab", "answer": "ba", "other_answer": "ab", "better": True},
        {"input": "Reverse: abcde", "answer": "edcba", "other_answer": "edcab", "better": True},  # both cut to "edc"
        {"input": "Reverse: abcdefghi", "answer": "x", "other_answer": "y", "better": False},  # prompt 16
        {"input": "Reverse: k3x9q", "answer": "q9x3k", "other_answer": "qq", "better": False},  # one cut
    ]
    ds = PreferenceDataset(raw_json(tmp_path, records), tok, max_length=15, prompt_template=DEMO_TEMPLATE)
    assert ds.stats == {
        "raw": 4,
        "dropped_prompt_too_long": 1,
        "truncated_answers": 3,
        "dropped_identical_pair": 1,
        "dropped_empty_answer": 0,
        "kept": 2,
    }
    last = ds[1]
    assert last["better_input_ids"].tolist() == ids(tok, "USER: Reverse: k3x9q ASSISTANT:") + answer_ids(tok, "qq")
    assert len(last["worse_input_ids"]) == 15 and last["worse_input_ids"][-1] != tok.eos_token_id


def test_safety_preference_orders_by_safer_with_signs(tiny_tokenizer):
    tok = tiny_tokenizer
    ds = SafetyPreferenceDataset(f"PKU-SafeRLHF/safety:1:{PKU}", tok, prompt_template=DEMO_TEMPLATE)
    lock = ds[2]  # answer 0 helpful but unsafe; response 1 safer and safe
    prompt = ids(tok, "USER: How do I pick a lock? ASSISTANT:")
    assert lock["better_input_ids"].tolist() == prompt + answer_ids(tok, "I can't help with that.")
    assert lock["worse_input_ids"].tolist() == prompt + answer_ids(tok, "Use a tension wrench.")
    assert (int(lock["better_sign"]), int(lock["worse_sign"])) == (1, -1)
    assert (int(ds[0]["better_sign"]), int(ds[0]["worse_sign"])) == (1, 1)
    batch = ds.get_collator()([ds[0], ds[2]])
    assert batch["better_sign"].tolist() == [1, 1] and batch["worse_sign"].tolist() == [1, -1]
    assert batch["better_sign"].dtype == paddle.int64 and batch["better_sign"].shape == [2]
    assert batch["better_input_ids"].shape == batch["worse_labels"].shape
    helpful = PreferenceDataset(f"PKU-SafeRLHF:1:{PKU}", tok, prompt_template=DEMO_TEMPLATE)
    assert helpful[2]["better_input_ids"].tolist() == lock["worse_input_ids"].tolist()  # helpfulness disagrees


def test_safety_preference_contradiction_and_missing_fields(tmp_path, tiny_tokenizer):
    bad = {"input": "q", "answer": "a", "other_answer": "b", "safer": True, "is_safe": False, "is_other_safe": True}
    with pytest.raises(ValueError, match=r"r.jsonl, line 1 \(sample 0 of dataset 'json'\): the safer answer is flagged unsafe"):
        SafetyPreferenceDataset(raw_json(tmp_path, [bad]), tiny_tokenizer)
    helpful_only = {"input": "q", "answer": "a", "other_answer": "b", "better": True}
    with pytest.raises(ValueError, match=r"needs field\(s\) \['safer', 'is_safe', 'is_other_safe'\]"):
        SafetyPreferenceDataset(raw_json(tmp_path, [helpful_only], "h.jsonl"), tiny_tokenizer)


# --------------------------------------------------------------------------- prompt only


def test_prompt_only_dedup_left_padding_position_ids(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    records = [reverse("k3x9q"), {"src": "Reverse: ab", "tgt": "ba"}, reverse("k3x9q"), {"src": ["Reverse: ab"]}]
    records[2]["tgt"] = ["other"]  # a duplicate prompt: the first occurrence (tgt q9x3k) is kept
    ds = PromptOnlyDataset(jsonfile(tmp_path, records), tok, prompt_template=DEMO_TEMPLATE)
    assert ds.stats == {"raw": 4, "duplicates_removed": 2, "dropped_prompt_too_long": 0, "kept": 2}
    assert [ds[i]["label"] for i in range(2)] == ["q9x3k", "ba"]
    assert ds[0]["input_ids"].tolist() == ids(tok, "USER: Reverse: k3x9q ASSISTANT:")

    batch = ds.get_collator()([ds[1], ds[0]])
    assert list(batch) == ["input_ids", "attention_mask", "position_ids", "prompt", "src", "label", "extra"]
    assert batch["extra"] == [{}, {}]  # the records have no fields beyond src and tgt
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert batch[key].dtype == paddle.int64 and batch[key].shape == [2, 12], key
    short = ids(tok, "USER: Reverse: ab ASSISTANT:")
    assert batch["input_ids"].numpy()[0].tolist() == [tok.pad_token_id] * 3 + short  # left padding
    assert batch["attention_mask"].numpy().tolist() == [[0] * 3 + [1] * 9, [1] * 12]
    assert batch["position_ids"].numpy().tolist() == [[0, 0, 0] + list(range(9)), list(range(12))]
    assert batch["prompt"] == ["USER: Reverse: ab ASSISTANT:", "USER: Reverse: k3x9q ASSISTANT:"]
    assert batch["src"] == ["Reverse: ab", "Reverse: k3x9q"]
    assert batch["label"] == ["ba", "q9x3k"]


def test_prompt_only_multi_turn_src_and_no_label(tiny_tokenizer):
    ds = PromptOnlyDataset(f"Jsonfile:1:{JSONFILE}", tiny_tokenizer, prompt_template=DEMO_TEMPLATE)
    assert len(ds) == 4
    assert ds[2]["prompt"] == "USER: Reverse: abc ASSISTANT:cba USER: Reverse: xyz ASSISTANT:"
    assert ds[2]["src"] == "Reverse: xyz" and ds[2]["label"] == "zyx"
    assert ds[3]["label"] is None
    assert PromptOnlyDataset(f"PKU-SafeRLHF:1:{PKU}", tiny_tokenizer)[0]["label"] is None


def test_prompt_only_drops_prompts_longer_than_max_prompt_len(tmp_path, tiny_tokenizer):
    records = [reverse(s) for s in ("ab", "abcdefghi", "abcdefghij")]  # prompts of 9, 16, 17 tokens
    spec = jsonfile(tmp_path, records)
    ds = PromptOnlyDataset(spec, tiny_tokenizer, max_prompt_len=16, prompt_template=DEMO_TEMPLATE)
    assert ds.stats["dropped_prompt_too_long"] == 1 and [len(ds[i]["input_ids"]) for i in range(2)] == [9, 16]
    by_max_length = PromptOnlyDataset(spec, tiny_tokenizer, max_length=9, prompt_template=DEMO_TEMPLATE)
    assert len(by_max_length) == 1 and by_max_length.max_prompt_len == 9


# --------------------------------------------------------------------------- integration


def test_dataloader_and_seeded_mixing(tmp_path, tiny_tokenizer):
    records = [reverse(s) for s in ("ab", "abc", "abcd", "k3x9q", "k3x9", "x9q", "q9", "k3")]
    spec = jsonfile(tmp_path, records)
    a = SupervisedDataset(spec.replace(":1:", ":0.5:"), tiny_tokenizer, prompt_template=DEMO_TEMPLATE, seed=7)
    b = SupervisedDataset(spec.replace(":1:", ":0.5:"), tiny_tokenizer, prompt_template=DEMO_TEMPLATE, seed=7)
    assert len(a) == 4 and [x["input_ids"].tolist() for x in a] == [x["input_ids"].tolist() for x in b]
    loader = paddle.io.DataLoader(a, batch_size=3, shuffle=False, collate_fn=a.get_collator())
    batches = list(loader)
    assert [bt["input_ids"].shape[0] for bt in batches] == [3, 1]
    assert batches[0]["labels"].shape == batches[0]["input_ids"].shape


def test_demo_data_builds_every_dataset_kind(tmp_path, tiny_tokenizer):
    from ppo.tiny.demo_data import generate

    generate(
        str(tmp_path), num_sft=12, num_preference=8, num_preference_eval=4, num_prompts=6, num_test=4
    )
    specs = demo_dataset_specs(str(tmp_path))
    kw = dict(tokenizer=tiny_tokenizer, prompt_template=DEMO_TEMPLATE, max_length=32)
    sft = SupervisedDataset(specs["sft"], **kw)
    pref = PreferenceDataset(specs["preference"], **kw)
    prompts = PromptOnlyDataset(specs["prompts"], **kw)
    assert len(sft) == 12 and sft.stats["truncated_answer"] == 0
    assert len(pref) + pref.stats["dropped_identical_pair"] == 8
    assert len(prompts) == 6 and all(p["prompt"].startswith("USER: Reverse: ") for p in prompts)
    first = json.loads(open(tmp_path / "prompts.jsonl").readline())
    assert prompts[0]["src"] == first["src"][0] and prompts[0]["label"] == first["tgt"][0]
    assert len(PromptOnlyDataset(specs["kk"], **dict(kw, max_length=512))) == 3


def test_split_train_test_is_seeded_and_disjoint(tmp_path, tiny_tokenizer):
    records = [reverse(s) for s in ("ab", "abc", "abcd", "k3x9q", "k3x9", "x9q", "q9", "k3", "a1", "b2")]
    ds = PromptOnlyDataset(jsonfile(tmp_path, records), tiny_tokenizer, prompt_template=DEMO_TEMPLATE)
    train, test = ds.split_train_test(split_ratio=0.3, seed=1)
    again, _ = ds.split_train_test(split_ratio=0.3, seed=1)
    assert (len(train), len(test)) == (7, 3) and len(ds) == 10
    assert {p["prompt"] for p in train} | {p["prompt"] for p in test} == {p["prompt"] for p in ds}
    assert [p["prompt"] for p in train] == [p["prompt"] for p in again]
    assert type(train.get_collator()) is type(ds.get_collator())
    with pytest.raises(ValueError, match="split_ratio"):
        ds.split_train_test(split_ratio=1.0)
