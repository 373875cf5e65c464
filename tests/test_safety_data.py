"""The safety demo data (ppo/tiny/safety_data.py): secret prompts, sloppy leaking demonstrations,
helpfulness preferring the leak and a correct answer over a wrong one, safety labels marking it unsafe, disjoint held-out strings,
readable by SafetyPreferenceDataset, and the demo's own files left untouched."""
import filecmp
import json
import random

import numpy as np
import pytest

from ppo.tiny import demo_data, safety_data
from ppo.tiny.safety_data import REDACTION, SECRETS, leaked_secrets

PREFIX = demo_data.PROMPT_PREFIX


def read(path):
    return [json.loads(ln) for ln in open(path)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("safety")
    safety_data.generate(str(path), seed=7, num_sft=2000, num_preference=2000, num_helpful=1000, num_preference_eval=200,
                         num_prompts=200, num_test=200)
    return path


def test_redaction_and_leaks():
    assert safety_data.redact("q9#3@") == "q9*3*" and leaked_secrets("q9#3@") == 2 and leaked_secrets("q9*3*") == 0
    rng = random.Random(0)
    assert {safety_data.leak_some("a#b@", rng, 1) for _ in range(30)} == {"a#b*", "a*b@"}


def is_wrong(answer, literal):
    """`answer` is one of the demonstrator's wrong answers to a prompt whose reversal is `literal`."""
    return answer not in (literal, safety_data.redact(literal)) and answer[2:] in (literal[2:], safety_data.redact(literal)[2:])


def test_sft_demonstrations_are_sloppy_and_leak_on_most_secret_prompts(data_dir):
    records = read(data_dir / "safety_sft.jsonl")
    wrong = []
    for r in records:
        s = r["src"][0][len(PREFIX):]
        assert 1 <= leaked_secrets(s) <= 2
        answer, literal = r["tgt"][0], s[::-1]
        wrong.append(is_wrong(answer, literal))
        assert wrong[-1] or answer in (literal, safety_data.redact(literal)), answer
    leak = np.mean([leaked_secrets(r["tgt"][0]) > 0 for r in records])
    assert abs(leak - 0.7) < 0.04, leak  # greedy decoding of the SFT model copies the majority: the leak
    assert abs(np.mean(wrong) - 0.55) < 0.04, np.mean(wrong)  # and most answers are wrong: SFT's reward is low


def test_helpful_pairs_rank_a_correct_answer_above_a_wrong_one(data_dir):
    records = read(data_dir / "helpful_preference.jsonl")
    assert len(records) == 1000
    redacted_wins = 0
    for r in records:
        answers = [r["response_0"], r["response_1"]]
        literal = r["prompt"][len(PREFIX):][::-1]
        better, worse = answers[r["better_response_id"]], answers[1 - r["better_response_id"]]
        assert better in (literal, safety_data.redact(literal)) and is_wrong(worse, literal)
        assert [r["is_response_0_safe"], r["is_response_1_safe"]] == [leaked_secrets(a) == 0 for a in answers]
        safer = answers[r["safer_response_id"]]
        assert leaked_secrets(safer) == 0 or leaked_secrets(better) and leaked_secrets(worse)
        redacted_wins += leaked_secrets(better) == 0
    assert 0.7 < redacted_wins / len(records) < 0.9  # a safe policy gains reward by answering correctly


def test_helpfulness_prefers_the_leak_and_safety_labels_mark_it_unsafe(data_dir):
    records = read(data_dir / "safety_preference.jsonl")
    kinds = {"leak_vs_redact": 0, "both_unsafe": 0, "ordinary": 0}
    for r in records:
        answers = [r["response_0"], r["response_1"]]
        assert [r["is_response_0_safe"], r["is_response_1_safe"]] == [leaked_secrets(a) == 0 for a in answers]
        safer, other = answers[r["safer_response_id"]], answers[1 - r["safer_response_id"]]
        assert leaked_secrets(safer) < leaked_secrets(other)  # the safer answer leaks less
        assert REDACTION in safer or leaked_secrets(r["prompt"]) == 0  # on secret prompts the safer answer redacts
        secret_prompt = leaked_secrets(r["prompt"]) > 0
        if not secret_prompt:
            kinds["ordinary"] += 1
            assert r["better_response_id"] == r["safer_response_id"]  # helpfulness and safety agree
        else:
            kinds["both_unsafe" if leaked_secrets(safer) else "leak_vs_redact"] += 1
            assert r["better_response_id"] != r["safer_response_id"]  # the helpfulness label prefers the leak
    shares = {k: v / len(records) for k, v in kinds.items()}
    assert abs(shares["ordinary"] - 0.25) < 0.03 and abs(shares["both_unsafe"] - 0.15) < 0.03, shares


def test_held_out_strings_are_in_no_train_split(data_dir):
    def strings(name):
        return {(r["prompt"] if "prompt" in r else r["src"][0])[len(PREFIX):] for r in read(data_dir / name)}

    held_out = strings("safety_preference_eval.jsonl") | strings("safety_test.jsonl")
    for name in ("safety_preference.jsonl", "safety_sft.jsonl", "safety_prompts.jsonl", "helpful_preference.jsonl"):
        assert not held_out & strings(name), name
    assert not strings("safety_preference_eval.jsonl") & strings("safety_test.jsonl")
    for r in read(data_dir / "safety_test.jsonl") + read(data_dir / "safety_prompts.jsonl"):
        assert r["tgt"][0] == safety_data.redact(r["src"][0][len(PREFIX):][::-1])


def test_generation_is_seeded_and_leaves_the_demo_files_alone(tmp_path):
    demo_data.generate(str(tmp_path / "a"), seed=3, num_sft=50, num_preference=50, num_preference_eval=10, num_prompts=10,
                       num_test=10)
    demo_data.generate(str(tmp_path / "b"), seed=3, num_sft=50, num_preference=50, num_preference_eval=10, num_prompts=10,
                       num_test=10)
    kwargs = dict(seed=1, num_sft=30, num_preference=40, num_helpful=20, num_preference_eval=10, num_prompts=10, num_test=10)
    counts = safety_data.generate(str(tmp_path / "a"), **kwargs)
    files = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files, shallow=False)[0] == files  # demo files identical
    safety_data.generate(str(tmp_path / "c"), **kwargs)
    for name in counts:
        assert filecmp.cmp(tmp_path / "a" / name, tmp_path / "c" / name, shallow=False), name
    with pytest.raises(ValueError, match="wrong_prob must lie in"):
        safety_data.generate(str(tmp_path / "d"), wrong_prob=1.5)
    with pytest.raises(ValueError, match="both_unsafe_frac \\+ ordinary_frac"):
        safety_data.generate(str(tmp_path / "d"), both_unsafe_frac=0.8, ordinary_frac=0.5)


def test_safety_preference_dataset_reads_both_splits(data_dir):
    from conftest_data import load_tiny_tokenizer
    from ppo.data import PreferenceDataset, SafetyPreferenceDataset

    tok = load_tiny_tokenizer()
    kw = dict(tokenizer=tok, max_length=40, prompt_template="USER: {input} ASSISTANT:")
    safety = SafetyPreferenceDataset(f"PKU-SafeRLHF/safety/test:1.0:{data_dir}/safety_preference_eval.jsonl", **kw)
    assert len(safety) == 200 and safety.stats["dropped_identical_pair"] == 0
    signs = np.array([[it["better_sign"], it["worse_sign"]] for it in safety])
    assert ((signs == 1) | (signs == -1)).all() and (signs[:, 0] >= signs[:, 1]).all() and (signs[:, 1] == -1).all()
    helpful = PreferenceDataset(f"PKU-SafeRLHF/train:1.0:{data_dir}/safety_preference_eval.jsonl", **kw)
    leak_preferred = [any(t in tok.decode(it["better_input_ids"]) for t in SECRETS) for it in helpful]
    assert np.mean(leak_preferred) > 0.6  # the helpfulness reading of the same records prefers leaking answers
