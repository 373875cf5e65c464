"""`report_to` wandb and tensorboard: the PPO loop writes every metrics.jsonl scalar through the
libraries' own writers (TensorBoard events read back with EventAccumulator, the offline W&B run's
`.wandb` log read record by record), SFT reports to W&B through PaddleNLP's WandbCallback, and
a missing package is an error naming the pip package before any model loads."""
import glob
import importlib.util
import json
import os
import struct
import time

import numpy as np
import pytest

from ppo.common.report_writers import TRAINER_PACKAGES, missing_report_packages

WANDB_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 7-byte header, 32 KiB blocks of CRC'd chunks


def wandb_records(path):
    """The serialised records of a `.wandb` run file (full, or first/middle/last chunk types)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # a chunk still being written
            return
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


def wandb_history(run_dir, timeout_s=60):
    """`[{metric: value, '_step': step}, ...]` of the finished offline run under `run_dir/wandb/`.
    wandb's service writes the file after `finish()` returns: wait for the run's exit record."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    deadline = time.time() + timeout_s
    while True:
        records = []
        for raw in wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.time() > deadline:
            break
        time.sleep(0.5)
    return [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def metrics_rows(out):
    return [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]


def scalar_rows(out):
    """metrics.jsonl as `{step: {name: value}}` for the float metrics the writers send."""
    rows = {}
    for row in metrics_rows(out):
        rows.setdefault(row["step"], {}).update({k: v for k, v in row.items() if k != "step" and isinstance(v, float)})
    return rows


def run_ppo_reporting(model_dir, rm_dir, data_dir, out, report_to):
    from tests.test_ppo_trainer import ppo_argv
    from ppo.run_ppo import main as run_ppo

    run_ppo(ppo_argv(model_dir, rm_dir, data_dir, out, "--report_to", report_to, "--logging_dir", f"{out}/logs"))


def test_missing_package_is_named_before_models_load(monkeypatch, tmp_path):
    from tests.test_ppo_training_arguments import parse_ppo

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("wandb", "tensorboardX") else real(name, *a))
    assert missing_report_packages(["visualdl", "wandb"]) == ["report_to wandb needs the wandb package: pip install wandb"]
    assert missing_report_packages(["tensorboard"], TRAINER_PACKAGES) == [
        "report_to tensorboard needs the tensorboardX package: pip install tensorboardX"]
    with pytest.raises(ValueError, match="report_to wandb needs the wandb package: pip install wandb"):
        parse_ppo("--output_dir", str(tmp_path), "--report_to", "wandb")


def test_ppo_tensorboard_events_match_metrics_jsonl(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = str(tmp_path / "tb")
    run_ppo_reporting(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "tensorboard")
    events = EventAccumulator(os.path.join(out, "logs"), size_guidance={"scalars": 0})
    events.Reload()
    expected = scalar_rows(out)
    tags = events.Tags()["scalars"]
    assert "objective/scores" in tags and "loss/value_avg" in tags
    assert set(tags) == {name for row in expected.values() for name in row}
    for tag in tags:
        written = {e.step: e.value for e in events.Scalars(tag)}
        wanted = {step: row[tag] for step, row in expected.items() if tag in row}
        assert written.keys() == wanted.keys(), tag
        np.testing.assert_allclose([written[s] for s in wanted], list(wanted.values()), rtol=1e-6, err_msg=tag)
    assert not os.path.exists(os.path.join(out, "logs", "vdlrecords"))  # only the asked-for writer


def test_ppo_wandb_offline_history_matches_metrics_jsonl(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = str(tmp_path / "wb")
    run_ppo_reporting(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "wandb")
    expected = scalar_rows(out)
    history = {row["_step"]: row for row in wandb_history(os.path.join(out, "logs"))}
    assert sorted(history) == sorted(expected) == [1, 2]
    for step, row in expected.items():
        assert set(row) <= set(history[step]), set(row) - set(history[step])
        for name, value in row.items():
            assert history[step][name] == pytest.approx(value, rel=1e-9), (step, name)


def test_sft_reports_to_wandb_through_paddlenlp_callback(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    from tests.test_sft import sft_argv
    from sft.run_sft import main as run_sft

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = str(tmp_path / "sft")
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "4", "--logging_steps", "2", "--eval_steps", "4",
                     "--save_steps", "4", "--report_to", "wandb", "--logging_dir", f"{out}/logs"))
    import wandb

    wandb.finish()  # PaddleNLP's callback leaves the run open until the process exits (wandb's atexit)
    losses = [row["train/loss"] for row in wandb_history(os.path.join(out, "logs")) if "train/loss" in row]
    jsonl = [row["loss/sft"] for row in metrics_rows(out) if "loss/sft" in row]
    assert len(losses) == len(jsonl) == 2
    np.testing.assert_allclose(losses, jsonl, rtol=1e-6)


def test_trainer_entry_points_name_the_integration_package(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    from tests.test_sft import sft_argv
    from sft.run_sft import main as run_sft

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboardX" else real(name, *a))
    with pytest.raises(ValueError, match="report_to tensorboard needs the tensorboardX package: pip install tensorboardX"):
        run_sft(sft_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "sft"), "--report_to", "tensorboard"))
    assert not os.path.exists(tmp_path / "sft" / "resolved_arguments.json")  # stopped before anything ran


def test_sft_reports_to_tensorboard_through_paddlenlp_callback(tiny_model_dir, tiny_data_dir, tmp_path):
    """PaddleNLP's TensorBoard callback (tensorboardX) writes the Trainer's loss under
    `logging_dir`; its values are the losses of metrics.jsonl."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.test_sft import sft_argv
    from sft.run_sft import main as run_sft

    out = str(tmp_path / "sft")
    # no evaluation: PaddleNLP's callback opens a second writer for an evaluation after training,
    # whose event file would take the first one's name when both fall in the same second
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "4", "--logging_steps", "2", "--eval_datasets", "",
                     "--save_steps", "4", "--report_to", "tensorboard", "--logging_dir", f"{out}/logs"))
    events = EventAccumulator(os.path.join(out, "logs"))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    jsonl = [row["loss/sft"] for row in metrics_rows(out) if "loss/sft" in row]
    assert len(losses) == len(jsonl) == 2
    np.testing.assert_allclose(losses, jsonl, rtol=1e-6)
