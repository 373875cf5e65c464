"""PaddleNLP's `benchmark: true` (`ppo.entry.benchmark`): a reward-model run that asks for
evaluations and checkpoints every step trains only, saves no checkpoint and no model, evaluates
nothing, and writes benchmark.json whose token counts are those of the batches it trained."""
import json
import os

import numpy as np
import pytest

from ppo.data import PreferenceDataset
from ppo.entry.benchmark import REPORT_FILE, batch_tokens, timing_report
from ppo.models.loading import load_tokenizer
from tests.test_lazy_streaming import SETTINGS, spec, write_pairs


def test_batch_tokens_count_masked_and_padded_positions():
    inputs = {"better_input_ids": np.array([[5, 6, 0], [7, 0, 0]]), "better_attention_mask": np.array([[1, 1, 0], [1, 0, 0]]),
              "worse_input_ids": np.array([[5, 0, 0], [7, 8, 9]]), "worse_attention_mask": np.array([[1, 0, 0], [1, 1, 1]]),
              "labels": np.zeros([2, 3])}
    assert batch_tokens(inputs, pad_token_id=0) == (2, 7, 12)
    packed = {"input_ids": np.array([[5, 6, 7, 0]]), "attention_mask": np.ones([1, 1, 4, 4], bool)}  # rows packed: 4-D mask
    assert batch_tokens(packed, pad_token_id=0) == (1, 3, 4)


def test_timing_report_rates_and_step_times():
    report = timing_report(4.0, 2, 8, 100, 200, [3.0, 0.5])
    assert report["tokens_per_s"] == 25.0 and report["samples_per_s"] == 2.0 and report["steps_per_s"] == 0.5
    assert report["effective_token_ratio"] == 0.5 and report["padded_tokens_per_s"] == 50.0
    assert report["step_time_s"] == {"first": 3.0, "mean_after_first": 0.5, "min_after_first": 0.5, "max_after_first": 0.5}


def test_a_benchmark_reward_run_trains_only_and_reports_its_tokens(tiny_model_dir, tmp_path):
    """2 steps of 4 streamed records (lazy, as PaddleNLP's flashmask rm.json), evaluation and a
    checkpoint asked for every step: none happens, and the report counts the 8 first records'
    tokens (better + worse) and the padded batches' positions."""
    from rm.run_reward import main

    data = write_pairs(tmp_path / "pairs.jsonl", 30)
    out = str(tmp_path / "bench")
    main(["config/tiny/rm_argument.json", "--model_name_or_path", tiny_model_dir, "--output_dir", out,
          "--logging_dir", f"{out}/vdl", "--train_datasets", f"paddlenlp-dpo:1:{data}",
          "--eval_datasets", f"paddlenlp-dpo:1:{data}", "--benchmark", "true", "--lazy", "true", "--max_steps", "2",
          "--save_steps", "1", "--eval_steps", "1", "--evaluation_strategy", "steps", "--do_eval", "true",
          "--logging_steps", "1", "--per_device_train_batch_size", "4", "--max_length", "64", "--warmup_steps", "0",
          "--prompt_template", "{input}", "--disable_tqdm", "true", "--report_to", "visualdl"])
    files = set(os.listdir(out))
    assert not [f for f in files if f.startswith("checkpoint-")]
    assert not files & {"model_state.pdparams", "model.safetensors", "config.json", "tokenizer_config.json"}
    report = json.load(open(os.path.join(out, REPORT_FILE)))
    items = PreferenceDataset(spec(data), tokenizer=load_tokenizer(tiny_model_dir), **SETTINGS).data[:8]
    lengths = [(len(i["better_input_ids"]), len(i["worse_input_ids"])) for i in items]
    assert report["steps"] == 2 and report["samples"] == 8
    assert report["tokens"] == sum(a + b for a, b in lengths)
    assert report["padded_tokens"] == sum(2 * 4 * max(max(p) for p in lengths[k:k + 4]) for k in (0, 4))
    assert report["tokens_per_s"] == pytest.approx(report["tokens"] / report["train_runtime_s"])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows if "rm/loss" in r] == [1, 2]
    assert not [k for r in rows for k in r if k.startswith("eval/")]


def test_benchmark_needs_training(tiny_model_dir):
    from ppo.common.argument_parsing import parse_collecting
    from rm.reward_arguments import DataArgument, ModelArgument, RewardTrainingArguments, validate_arguments

    argv = ["config/tiny/rm_argument.json", "--model_name_or_path", tiny_model_dir, "--output_dir", "/tmp/bench-parse",
            "--benchmark", "true", "--do_train", "false", "--resume_from_checkpoint", "/tmp/bench-parse/checkpoint-1"]
    _, problems = parse_collecting((ModelArgument, DataArgument, RewardTrainingArguments), argv, validate_arguments)
    assert any("benchmark true times the training, and do_train is false: set do_train true" in p for p in problems)
    assert any("leave resume_from_checkpoint unset" in p for p in problems)
