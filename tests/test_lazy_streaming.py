"""PaddleNLP's `lazy: true` (`ppo.data.streaming`, `ppo.entry.streaming_trainer`): the streamed
items equal the eagerly tokenised ones in file order, memory does not grow with the file, a
loader resumed at a saved position hands out the next record, and a reward-model run resumed
from a checkpoint trains exactly what the uninterrupted run trained."""
import json
import os
import signal
import sys
import tracemalloc

import numpy as np
import pytest

from ppo.data import PreferenceDataset
from ppo.data.base import DataError
from ppo.data.streaming import StreamingDataset, training_dataset
from ppo.entry.streaming_trainer import POSITION_FILE, StreamLoader
from ppo.models.loading import load_tokenizer


def write_pairs(path, n, start=0):
    """`n` PaddleNLP DPO records; record k's prompt names k (its line is k - start + 1)."""
    with open(path, "w", encoding="utf-8") as f:
        for k in range(start, start + n):
            f.write(json.dumps({"src": [f"question {k} about {k % 7}"], "tgt": [], "response": [f"yes {k}", f"no {k % 5}"],
                                "sort": [1, 0] if k % 2 else [0, 1]}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


SETTINGS = dict(max_length=48, prompt_template="{input}")


def spec(path):
    return [f"paddlenlp-dpo:1:{path}"]


def test_streamed_items_are_the_eager_items_in_file_order(tokenizer, tmp_path):
    path = write_pairs(tmp_path / "pairs.jsonl", 23)
    eager = PreferenceDataset(spec(path), tokenizer=tokenizer, **SETTINGS)
    streamed = training_dataset(PreferenceDataset, spec(path), True, tokenizer=tokenizer, **SETTINGS)
    assert isinstance(streamed, StreamingDataset)
    items = [item for item in streamed]  # list() asks Paddle's IterableDataset for a length
    assert len(items) == len(eager) == 23
    for got, want in zip(items, eager.data):
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    positions = [after for _, after in streamed.items()]
    assert [p["line"] for p in positions] == list(range(1, 24))
    assert positions[-1]["offset"] == os.path.getsize(path)


def _peak_bytes_streaming(path, tokenizer):
    dataset = StreamingDataset(PreferenceDataset, spec(path), tokenizer=tokenizer, **SETTINGS)
    tracemalloc.start()
    count = sum(1 for _ in dataset)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return count, peak


@pytest.mark.slow
def test_memory_does_not_grow_with_the_file(tokenizer, tmp_path):
    """Peak Python memory while streaming 200 and 1,600 records: the same (within 64 KiB), while
    the 1,600 items themselves hold over 600 kB (what an eager read keeps)."""
    small, large = write_pairs(tmp_path / "small.jsonl", 200), write_pairs(tmp_path / "large.jsonl", 1600)
    n_small, peak_small = _peak_bytes_streaming(small, tokenizer)
    n_large, peak_large = _peak_bytes_streaming(large, tokenizer)
    assert (n_small, n_large) == (200, 1600)
    tracemalloc.start()
    held = [item for item in StreamingDataset(PreferenceDataset, spec(large), tokenizer=tokenizer, **SETTINGS)]
    eager_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(held) == 1600 and eager_peak > 600_000
    assert peak_large - peak_small < 64 * 1024, (peak_small, peak_large)


def test_a_resumed_loader_hands_out_the_next_record(tokenizer, tmp_path):
    """Batches of 2: after 3 batches the position is line 6; a loader started there after 3
    placeholder batches (the steps the resuming Trainer drops) gives records 6 and 7."""
    path = write_pairs(tmp_path / "pairs.jsonl", 11)
    dataset = StreamingDataset(PreferenceDataset, spec(path), tokenizer=tokenizer, **SETTINGS)
    collate = list  # the batch is the list of items
    first = StreamLoader(dataset, collate, per_device=2)
    batches = iter(first)
    seen = [next(batches) for _ in range(3)]
    assert first.position["line"] == 6 and first.position["epoch"] == 0 and len(seen[-1]) == 2
    saved = json.loads(json.dumps(first.position))  # as a checkpoint holds it
    uninterrupted = list(batches)
    resumed = list(StreamLoader(dataset, collate, per_device=2, position=saved, skip=3))
    assert resumed[:3] == [None, None, None]
    assert len(resumed) - 3 == len(uninterrupted) == 3  # records 6-7, 8-9 and the last one alone
    for got, want in zip(resumed[3:], uninterrupted):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a["better_input_ids"], b["better_input_ids"])
    eager = PreferenceDataset(spec(path), tokenizer=tokenizer, **SETTINGS)
    np.testing.assert_array_equal(resumed[3][0]["better_input_ids"], eager.data[6]["better_input_ids"])


def test_the_epoch_ends_at_the_file_end_and_the_next_starts_at_line_one(tokenizer, tmp_path):
    path = write_pairs(tmp_path / "pairs.jsonl", 5)
    loader = StreamLoader(StreamingDataset(PreferenceDataset, spec(path), tokenizer=tokenizer, **SETTINGS), list, 2)
    assert [len(b) for b in loader] == [2, 2, 1]
    assert loader.position == {"epoch": 1, "source": 0, "offset": 0, "line": 0, "path": None}
    assert [len(b) for b in loader] == [2, 2, 1]


def test_data_ranks_take_their_share_of_each_global_batch(tokenizer, tmp_path):
    path = write_pairs(tmp_path / "pairs.jsonl", 9)
    dataset = StreamingDataset(PreferenceDataset, spec(path), tokenizer=tokenizer, **SETTINGS)
    eager = PreferenceDataset(spec(path), tokenizer=tokenizer, **SETTINGS).data
    ranks = [list(StreamLoader(dataset, list, per_device=2, rank=r, ranks=2)) for r in (0, 1)]
    assert [len(b) for b in ranks[0]] == [2, 2] == [len(b) for b in ranks[1]]  # the last record: dropped on both
    np.testing.assert_array_equal(ranks[1][1][0]["worse_input_ids"], eager[6]["worse_input_ids"])


def test_bad_records_and_unstreamable_files_name_the_problem(tokenizer, tmp_path):
    path = write_pairs(tmp_path / "pairs.jsonl", 3)
    with open(path, "a") as f:
        f.write("{not json\n")
    dataset = StreamingDataset(PreferenceDataset, spec(path), tokenizer=tokenizer, **SETTINGS)
    with pytest.raises(DataError, match=r"pairs\.jsonl, line 4: malformed JSON"):
        [item for item in dataset]
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"src": "a", "tgt": [], "response": ["b", "c"], "sort": [1, 0]}]))
    with pytest.raises(DataError, match="one JSON list"):
        StreamingDataset(PreferenceDataset, spec(listed), tokenizer=tokenizer, **SETTINGS)
    with pytest.raises(DataError, match="proportion 0.5"):
        StreamingDataset(PreferenceDataset, [f"paddlenlp-dpo:0.5:{path}"], tokenizer=tokenizer, **SETTINGS)
    with pytest.raises(DataError, match="does not start a line"):
        list(dataset.items({"epoch": 0, "source": 0, "offset": 5, "line": 0, "path": path}))


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# An entry point's main (argv[3]: rm.run_reward or sft.run_sft), SIGKILLed when the Trainer
# starts its second checkpoint (checkpoint-1 complete, step 2 trained and unsaved) when argv[2]
# is "kill".
KILL_AT_SECOND_SAVE = r"""
import importlib, os, signal, sys
sys.path.insert(0, sys.argv[1])
from ppo.entry.streaming_trainer import StreamingTrainerMixin
original, calls = StreamingTrainerMixin._save_checkpoint, [0]
def save(self, model, metrics=None):
    calls[0] += 1
    if sys.argv[2] == "kill" and calls[0] == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, model, metrics)
StreamingTrainerMixin._save_checkpoint = save
importlib.import_module(sys.argv[3]).main(sys.argv[4:])
"""

ENTRIES = {  # entry module -> (argument file, train_datasets spec format, logged loss)
    "rm.run_reward": ("config/tiny/rm_argument.json", "paddlenlp-dpo", "rm/loss"),
    "sft.run_sft": ("config/tiny/sft_argument.json", "Jsonfile", "loss/sft"),
}


def write_sft(path, n):
    with open(path, "w", encoding="utf-8") as f:
        for k in range(n):
            f.write(json.dumps({"src": f"say {k} twice", "tgt": f"{k} {k}"}) + "\n")
    return str(path)


def lazy_argv(entry, tiny_model_dir, data, out):
    config, data_format, _ = ENTRIES[entry]
    return [config, "--model_name_or_path", tiny_model_dir, "--output_dir", out,
            "--logging_dir", f"{out}/vdl", "--train_datasets", f"{data_format}:1:{data}", "--eval_datasets", "",
            "--lazy", "true", "--max_steps", "3", "--save_steps", "1", "--logging_steps", "1",
            "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--do_eval", "false",
            "--evaluation_strategy", "no", "--max_length", "64", "--warmup_steps", "0", "--report_to", "visualdl",
            "--save_total_limit", "5", "--disable_tqdm", "true"]


def run_entry(entry, argv, kill):
    from tests.warm_python import run

    return run([sys.executable, "-c", KILL_AT_SECOND_SAVE, REPO, "kill" if kill else "-", entry, *argv], cwd=REPO,
               env=dict(os.environ, MKL_DEBUG_CPU_TYPE="5"), capture_output=True, text=True, timeout=600)


def losses(out, name):
    """`{step: loss}`, the last row logged for each step (a rerun logs the steps after its checkpoint again)."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {r["step"]: r[name] for r in map(json.loads, f) if name in r}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_lazy_run_killed_after_its_checkpoint_resumes_at_the_next_record(entry, tiny_model_dir, tmp_path):
    """3 steps of 4 records (2 x 2 accumulated), a checkpoint each step: checkpoint k saves line
    4k. A run SIGKILLed while saving step 2 and rerun with the same arguments resumes from
    checkpoint-1 and trains steps 2 and 3 on the records the uninterrupted run trained them on
    (the same losses, the same saved positions)."""
    data = write_pairs(tmp_path / "data.jsonl", 40) if entry == "rm.run_reward" else write_sft(tmp_path / "data.jsonl", 40)
    whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
    done = run_entry(entry, lazy_argv(entry, tiny_model_dir, data, whole), kill=False)
    assert done.returncode == 0, done.stderr[-3000:]
    positions = [json.load(open(os.path.join(whole, f"checkpoint-{k}", POSITION_FILE))) for k in (1, 2, 3)]
    assert [p["line"] for p in positions] == [4, 8, 12] and positions[0]["path"] == data
    first = run_entry(entry, lazy_argv(entry, tiny_model_dir, data, killed), kill=True)
    assert first.returncode == -signal.SIGKILL and not os.path.exists(os.path.join(killed, "checkpoint-2"))
    rerun = run_entry(entry, lazy_argv(entry, tiny_model_dir, data, killed), kill=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming the data stream at line 5 of" in rerun.stdout + rerun.stderr
    assert json.load(open(os.path.join(killed, "checkpoint-3", POSITION_FILE))) == positions[2]
    name = ENTRIES[entry][2]
    want, got = losses(whole, name), losses(killed, name)
    assert sorted(want) == [1, 2, 3] and got[2] == pytest.approx(want[2], abs=1e-6)
    assert got[3] == pytest.approx(want[3], abs=1e-6)


def test_lazy_needs_max_steps_and_the_training_process(tiny_model_dir):
    """Refused before any model loads, each naming the setting to change."""
    from ppo.common.argument_parsing import parse_collecting
    from sft.sft_arguments import DataArgument, ModelArgument, SFTTrainingArguments, validate_arguments

    argv = ["config/tiny/sft_argument.json", "--model_name_or_path", tiny_model_dir, "--output_dir", "/tmp/lazy-parse",
            "--lazy", "true", "--max_steps", "-1", "--dataloader_num_workers", "2"]
    _, problems = parse_collecting((ModelArgument, DataArgument, SFTTrainingArguments), argv, validate_arguments)
    assert any("lazy true streams the data without counting it first: set max_steps" in p for p in problems)
    assert any("set dataloader_num_workers 0" in p for p in problems)
