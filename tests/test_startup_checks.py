"""Start-up checks before any model loads: tokenizer ids beyond the embedding, sequence limits
beyond `max_position_embeddings`."""
import json
import os
import shutil

import pytest

from ppo.common.startup_checks import highest_token_id, token_and_position_problems
from ppo.models.loading import load_tokenizer
from ppo.run_ppo import main as run_ppo
from sft.run_sft import main as run_sft
from tests.test_ppo_trainer import ppo_argv
from tests.test_trainer_faults import sft_argv


@pytest.fixture(scope="module")
def small_vocab_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model's directory with `vocab_size` cut to 50 in its config (the tokenizer has 100 ids)."""
    path = str(tmp_path_factory.mktemp("small_vocab") / "m")
    shutil.copytree(tiny_model_dir, path)
    config = json.load(open(os.path.join(path, "config.json")))
    config["vocab_size"] = 50
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    return path


def test_problems_name_the_model_the_ids_and_the_positions(tiny_model_dir, small_vocab_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    top = highest_token_id(tok)
    positions = json.load(open(os.path.join(tiny_model_dir, "config.json")))["max_position_embeddings"]
    assert token_and_position_problems(tok, [("m", tiny_model_dir)], positions, "max_length") == []
    found = token_and_position_problems(tok, [("m", small_vocab_model_dir), ("ref", tiny_model_dir)], positions + 1, "max_length")
    assert found == [
        f"m={small_vocab_model_dir}: the tokenizer produces ids up to {top} but the model's embedding has 50 rows "
        "(vocab_size); resize the embedding or use the model's own tokenizer",
        f"m={small_vocab_model_dir}: sequences of up to {positions + 1} tokens (max_length) exceed the model's "
        f"max_position_embeddings={positions}; shorten them",
        f"ref={tiny_model_dir}: sequences of up to {positions + 1} tokens (max_length) exceed the model's "
        f"max_position_embeddings={positions}; shorten them",
    ]


def test_entry_points_refuse_before_training(tiny_model_dir, tiny_rm_dir, tiny_data_dir, small_vocab_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"model_name_or_path=.*sequences of up to 129 tokens \(max_length\)"):
        run_sft(sft_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "sft"), "--max_length", "129"))
    with pytest.raises(ValueError, match=r"model_name_or_path=.*embedding has 50 rows"):
        run_sft(sft_argv(small_vocab_model_dir, tiny_data_dir, str(tmp_path / "sft2")))
    with pytest.raises(ValueError, match=r"actor_model_name_or_path=.*up to 130 tokens \(max_prompt_len \+ max_dec_len\)"):
        run_ppo(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, str(tmp_path / "ppo"), "--max_prompt_len", "120",
                         "--max_dec_len", "10"))
    for out in ("sft", "sft2", "ppo"):
        assert not os.path.exists(tmp_path / out / "metrics.jsonl")
