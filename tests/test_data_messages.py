"""Data problems named where they are: an empty file, an SFT record without its answer (file
and line), a GRPO prompt without `tgt` for the reward server (at dataset build), and every
prompt filtered out by max_prompt_len (with the reason and the longest prompt)."""
import json

import pytest

from ppo.data import PreferenceDataset, PromptOnlyDataset, SupervisedDataset
from ppo.data.base import DataError
from tests.demo_config_flags import GRPO_AS_BEFORE


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from ppo.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("cls,name", [(SupervisedDataset, "Jsonfile"), (PreferenceDataset, "PKU-SafeRLHF/train")])
def test_empty_file_names_the_file(cls, name, tokenizer, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=rf"{empty}: {cls.__name__} has no samples: the data holds no records"):
        cls([f"{name}:1.0:{empty}"], tokenizer)


def test_sft_record_without_answer_names_file_and_line(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "sft.jsonl", [{"src": "1+1", "tgt": "2"}, {"src": "2+2", "tgt": "4"}, {"src": "3+3"}])
    with pytest.raises(ValueError, match=rf"needs field\(s\) \['answer'\], but {path}, line 3 \(sample 2 of dataset 'Jsonfile'\) lacks them"):
        SupervisedDataset([f"Jsonfile:1.0:{path}"], tokenizer)


def test_reward_server_prompt_without_tgt_fails_at_build(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"src": "a", "tgt": "b"}] + [{"src": f"q{i}", "tgt": "x"} for i in range(30)] + [{"src": "late"}])
    PromptOnlyDataset([f"Jsonfile:1.0:{path}"], tokenizer)  # fine for a reward model
    with pytest.raises(ValueError, match=rf"{path}, line 32 .*no reference answer \('tgt'\); the reward server \(use_rm_server\)"):
        PromptOnlyDataset([f"Jsonfile:1.0:{path}"], tokenizer, require_label=True)


def test_grpo_entry_point_checks_tgt_before_loading_models(tiny_model_dir, tmp_path, monkeypatch):
    import ppo.run_ppo as run_ppo

    path = write_jsonl(tmp_path / "p.jsonl", [{"src": "a", "tgt": "b"}, {"src": "c"}])

    def no_models(*a, **k):
        raise AssertionError("models were loaded before the data was checked")

    from ppo.strategy import Strategy

    monkeypatch.setattr(Strategy, "load_models", no_models)
    with pytest.raises(ValueError, match=rf"{path}, line 2 .*no reference answer"):
        run_ppo.build_trainer(["config/tiny/grpo_argument.json", *GRPO_AS_BEFORE, "--actor_model_name_or_path", tiny_model_dir,
                               "--use_rm_server", "true", "--train_datasets", f"Jsonfile:1.0:{path}", "--eval_datasets", "",
                               "--output_dir", str(tmp_path / "o")])


def test_all_prompts_too_long_says_why(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "long.jsonl", [{"src": "word " * 40}, {"src": "word " * 60}, {"src": "word " * 60}])
    longest = len(tokenizer("USER: " + "word " * 60 + " ASSISTANT:")["input_ids"])
    with pytest.raises(DataError) as err:
        PromptOnlyDataset([f"Jsonfile:1.0:{path}"], tokenizer, max_prompt_len=8, prompt_template="USER: {input} ASSISTANT:")
    msg = str(err.value)
    assert msg.startswith(f"{path}: PromptOnlyDataset has no samples: 0 prompts kept of 3: 2 longer than max_prompt_len=8")
    assert "1 duplicates" in msg
    longest_reported = int(msg.split("the longest has ")[1].split(")")[0])
    assert abs(longest_reported - longest) <= 2 and longest_reported > 8
