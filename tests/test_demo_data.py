"""The demo-task generator: correct labels, the demonstrator's flaw, disjoint held-out split."""
import json
import random

import pytest

from ppo.tiny import demo_data


def read(path):
    return [json.loads(ln) for ln in open(path)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("reverse")
    demo_data.generate(str(path), seed=5, num_sft=2000, num_preference=500, num_prompts=300, num_test=200)
    return path


def test_flawed_answer_swaps_first_two_output_characters():
    assert demo_data.correct_answer("k3x9q") == "q9x3k"
    assert demo_data.flawed_answer("k3x9q") == "9qx3k"


def test_half_fixed_answer_repeats_one_of_the_first_two_characters():
    rng = random.Random(0)
    assert {demo_data.half_fixed_answer("q9x3k", rng) for _ in range(40)} == {"qqx3k", "99x3k"}


def test_rejected_answers_mix_the_flaw_and_its_half_fixes_in_the_given_shares():
    rng = random.Random(3)
    strings = [s for s in (demo_data.sample_string(rng) for _ in range(3000)) if s[-1] != s[-2]]
    rejected = [demo_data.rejected_answer(s, rng, 0.0, 0.0, half_fix_frac=0.3) for s in strings]
    flaw = sum(r == demo_data.flawed_answer(s) for s, r in zip(strings, rejected)) / len(strings)
    half = sum(r[0] == r[1] and r[2:] == s[::-1][2:] for s, r in zip(strings, rejected)) / len(strings)
    assert abs(half - 0.3) < 0.03 and abs(flaw - 0.7) < 0.03 and abs(flaw + half - 1.0) < 1e-9
    only_flaw = {demo_data.rejected_answer("k3x9q", rng, 0.0, 0.0, half_fix_frac=0.0) for _ in range(20)}
    assert only_flaw == {"9qx3k"}
    with pytest.raises(ValueError, match="half_fix_frac"):
        demo_data.rejected_answer("k3x9q", rng, 0.0, 0.8, half_fix_frac=0.3)


def test_wrong_symbol_answer_replaces_one_of_the_first_two_characters():
    rng = random.Random(1)
    answers = [demo_data.wrong_symbol_answer("q9x3k", rng) for _ in range(200)]
    for a in answers:
        differ = [i for i in range(5) if a[i] != "q9x3k"[i]]
        assert len(differ) == 1 and differ[0] in (0, 1) and a[differ[0]] in demo_data.ALPHABET
    assert {a[2:] for a in answers} == {"x3k"} and len({a[:2] for a in answers}) > 20


def test_rejected_answers_include_wrong_symbols_in_their_share():
    rng = random.Random(4)
    strings = [s for s in (demo_data.sample_string(rng) for _ in range(3000)) if s[-1] != s[-2]]
    rejected = [demo_data.rejected_answer(s, rng, 0.0, 0.0, half_fix_frac=0.3, wrong_symbol_frac=0.2) for s in strings]
    flaw = sum(r == demo_data.flawed_answer(s) for s, r in zip(strings, rejected)) / len(strings)
    half = sum(r[0] == r[1] and r[2:] == s[::-1][2:] for s, r in zip(strings, rejected)) / len(strings)
    wrong = sum(r[2:] == s[::-1][2:] and r[0] != r[1] and r != demo_data.flawed_answer(s) and r != s[::-1]
                for s, r in zip(strings, rejected)) / len(strings)
    assert abs(half - 0.3) < 0.035 and abs(wrong - 0.2) < 0.035 and abs(flaw - 0.5) < 0.035
    with pytest.raises(ValueError, match="wrong_symbol_frac"):
        demo_data.rejected_answer("k3x9q", rng, 0.0, 0.0, half_fix_frac=0.6, wrong_symbol_frac=0.5)


def test_sft_demonstrations_copy_the_flaw_only_on_long_strings(data_dir):
    records = read(data_dir / "sft.jsonl")
    short = [r for r in records if len(r["src"][0]) - len("Reverse: ") < 5]
    long_ = [r for r in records if len(r["src"][0]) - len("Reverse: ") >= 5]
    for r in short:
        assert r["tgt"][0] == r["src"][0][len("Reverse: "):][::-1]
    s = lambda r: r["src"][0][len("Reverse: "):]
    flawed = [r for r in long_ if r["tgt"][0] == demo_data.flawed_answer(s(r)) != demo_data.correct_answer(s(r))]
    distinct = [r for r in long_ if demo_data.flawed_answer(s(r)) != demo_data.correct_answer(s(r))]
    assert 0.62 < len(flawed) / len(distinct) < 0.78  # flaw_prob 0.7


def test_held_out_strings_appear_in_no_training_split(data_dir):
    test_prompts = {r["src"][0] for r in read(data_dir / "test.jsonl")}
    assert len(test_prompts) == 200
    train = {r["src"][0] for r in read(data_dir / "sft.jsonl") + read(data_dir / "prompts.jsonl")}
    train |= {r["prompt"] for r in read(data_dir / "preference.jsonl")}
    assert not test_prompts & train
    for r in read(data_dir / "test.jsonl"):
        assert r["tgt"][0] == r["src"][0][len("Reverse: "):][::-1]


def test_validation_prompts_are_the_preference_eval_strings_outside_test_and_train(data_dir):
    valid = read(data_dir / "valid.jsonl")
    assert [r["src"][0] for r in valid] == [r["prompt"] for r in read(data_dir / "preference_eval.jsonl")]
    assert all(r["tgt"][0] == r["src"][0][len("Reverse: "):][::-1] for r in valid)
    test = {r["src"][0] for r in read(data_dir / "test.jsonl")}
    train = {r["src"][0] for r in read(data_dir / "sft.jsonl") + read(data_dir / "prompts.jsonl")}
    assert not {r["src"][0] for r in valid} & (test | train)


def test_preference_pairs_follow_pku_schema(data_dir):
    for r in read(data_dir / "preference.jsonl"):
        s = r["prompt"][len("Reverse: "):]
        better = r[f"response_{r['better_response_id']}"]
        worse = r[f"response_{1 - r['better_response_id']}"]
        assert better == s[::-1] and worse != better
        assert r["safer_response_id"] == r["better_response_id"]


def test_generation_is_seeded(tmp_path):
    demo_data.generate(str(tmp_path / "a"), seed=9, num_sft=50, num_preference=20, num_prompts=20, num_test=20, num_preference_eval=10)
    demo_data.generate(str(tmp_path / "b"), seed=9, num_sft=50, num_preference=20, num_prompts=20, num_test=20, num_preference_eval=10)
    for name in ["sft.jsonl", "preference.jsonl", "prompts.jsonl", "test.jsonl"]:
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    with pytest.raises(ValueError, match="flaw_prob"):
        demo_data.generate(str(tmp_path / "c"), flaw_prob=1.5)


def test_write_splits_writes_each_split_and_the_counts(tmp_path):
    from ppo.tiny.demo_data import write_splits

    splits = {"a.jsonl": [{"src": ["x"]}, {"src": ["y"]}], "b.jsonl": []}
    assert write_splits(str(tmp_path), splits, "m.json", {"seed": 3}) == {"a.jsonl": 2, "b.jsonl": 0}
    assert [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()] == splits["a.jsonl"]
    assert (tmp_path / "b.jsonl").read_text() == ""
    assert json.loads((tmp_path / "m.json").read_text()) == {"seed": 3, "counts": {"a.jsonl": 2, "b.jsonl": 0}}
