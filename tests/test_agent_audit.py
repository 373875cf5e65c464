"""Multi-turn batches seen from outside the trainer: `sample_token_details` writes each
samples.jsonl row's token ids, policy mask and sampling log-probs (off by default), the written
mask being the trainer's loss mask; and the engine's log-probs of a multi-turn rollout are the
old log-probs (`use_rollout_logprobs`) or feed the rollout correction (`rollout_is`)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ppo.agents.formats import decode_exact
from ppo.run_ppo import build_trainer
from ppo.trainer.loop import StepClock
from tests.test_agent_training import grpo_agent_argv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def runs_of_ones(mask):
    """`[(start, end)]` of the runs of 1 in `mask`."""
    runs, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_written_mask_is_the_loss_mask_and_off_by_default(tiny_model_dir, tiny_data_dir, tmp_path):
    trainer = build_trainer(grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "g")))
    exp, _ = trainer.experience.make(StepClock())
    rows, _ = trainer.learner.sample_rows(exp)
    assert rows and not any(k in rows[0] for k in ("prompt_ids", "response_ids", "policy_mask", "sampling_logprobs"))
    trainer.learner.sample_rows.token_details = True
    rows, _ = trainer.learner.sample_rows(exp)
    loss = exp.loss_tensors()
    loss_mask, old, ids = (loss[k].numpy() for k in ("response_mask", "old_logprobs", "response_ids"))
    real = exp.attention_mask.numpy()[:, exp.prompt_len:]
    assert len(rows) == len(exp) == 8
    for i, row in enumerate(rows):
        n = len(row["response_ids"])
        assert n == len(row["policy_mask"]) == len(row["sampling_logprobs"]) and real[i, :n].all() and not real[i, n:].any()
        assert row["response_ids"] == ids[i, :n].tolist()
        assert row["policy_mask"] == loss_mask[i, :n].astype(int).tolist() and not loss_mask[i, n:].any()
        assert 0 in row["policy_mask"] and 1 in row["policy_mask"]  # tool answers and glue between the turns
        np.testing.assert_allclose(row["sampling_logprobs"], old[i, :n], atol=1e-6)
        assert all(lp == 0 for lp, m in zip(row["sampling_logprobs"], row["policy_mask"]) if not m)
        assert len(row["prompt_ids"]) == int(exp.attention_mask.numpy()[i, : exp.prompt_len].sum())
        assert row["logprobs_of"] == "old_logprobs"  # the engine's are not kept by default (see below)


@pytest.mark.slow
def test_samples_file_lets_a_user_check_the_mask_against_the_turns(tiny_model_dir, tiny_data_dir, tmp_path):
    """ppo/run_ppo.py with sample_token_details true: in samples.jsonl, the runs of 1 in each
    row's policy_mask decode to exactly the row's assistant turns, in order."""
    from paddlenlp.transformers import AutoTokenizer

    out = str(tmp_path / "audit")
    argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, out, "--sample_token_details", "true")
    proc = subprocess.run([sys.executable, "ppo/run_ppo.py", *argv], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(os.path.join(out, "samples.jsonl"))]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(rows) == 8
    for row in rows:
        assistant = [t["text"] for t in row["turns"]["turns"] if t["role"] == "assistant"]
        ids = row["response_ids"]
        decoded = [decode_exact(tokenizer, ids[a:b]) for a, b in runs_of_ones(row["policy_mask"])]
        assert decoded == assistant and len(assistant) >= 2
        assert row["logprobs_of"] == "engine"
        assert all((lp < 0) == bool(m) for lp, m in zip(row["sampling_logprobs"], row["policy_mask"]))
        others = [decode_exact(tokenizer, ids[a:b]) for a, b in runs_of_ones([1 - m for m in row["policy_mask"]])]
        gaps = "".join("\n" if t["role"] == "assistant" else t["text"] for t in row["turns"]["turns"][1:])
        assert others == [g for g in gaps.split("\n") if g]  # each gap: glue, the tool's answer, glue


def test_multi_turn_engine_logprobs_are_the_old_logprobs(tiny_model_dir, tiny_data_dir, tmp_path):
    """reuse_trajectory_logprobs: the rollout's Experience comes with old log-probs, the engine's,
    equal to the training forward's at every policy token, 0 elsewhere. Off (the default), the
    old log-probs are left to the training forward (a run does not depend on the rows' schedule)."""
    trainer = build_trainer(grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "g"),
                                            "--reuse_trajectory_logprobs", "true"))
    exp = trainer.experience.rollout.generate()
    assert exp.old_logprobs is not None and exp.rollout_logprobs is None
    mask = exp.response_mask.numpy() == 1
    forward = trainer.passes.logprobs("actor", exp).numpy()
    np.testing.assert_allclose(exp.old_logprobs.numpy()[mask], forward[mask], atol=2e-4)
    assert not exp.old_logprobs.numpy()[~mask].any() and mask.sum() > 0
    trainer = build_trainer(grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "d")))
    exp = trainer.experience.rollout.generate()
    assert exp.old_logprobs is None and exp.rollout_logprobs is None


def test_reusing_logprobs_needs_a_multi_turn_run_that_keeps_them(tiny_model_dir, tiny_data_dir, tmp_path):
    from ppo.common.argument_problems import UsageError
    from ppo.run_ppo import start_up

    argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "r"), "--reuse_trajectory_logprobs", "true",
                           "--use_rollout_logprobs", "false")
    with pytest.raises(UsageError) as err:
        start_up(argv)
    assert "reuse_trajectory_logprobs makes the engine's log-probs the old log-probs; use_rollout_logprobs false" \
        in str(err.value)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_multi_turn_rollout_correction_reads_the_engine_logprobs(tiny_model_dir, tiny_data_dir, tmp_path, level):
    """rollout_is with a multi-turn run: the engine's log-probs are kept as rollout_logprobs, the
    old log-probs come from the training forward, and the step reports the correction
    (rollout/* metrics: a mismatch near 0, weights near 1)."""
    trainer = build_trainer(grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "g"), "--use_rollout_logprobs",
                                            "false", "--rollout_is", level))
    exp, stats = trainer.experience.make(StepClock())
    assert exp.rollout_logprobs is not None and exp.rollout_is_weights is not None
    assert float(stats["rollout/logprob_diff_max"]) < 1e-3
    assert abs(float(stats["rollout/is_weight_mean"]) - 1.0) < 1e-3
    weights, mask = exp.rollout_is_weights.numpy(), exp.response_mask.numpy()
    assert not weights[mask == 0].any() and np.all(np.abs(weights[mask == 1] - 1.0) < 1e-3)
