"""bench/packing_bench.py's harness at a tiny size: the SFT and GRPO-update sections of its
JSON, the length-skewed rollout it builds, and the token counts each layout computes."""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import packing_bench  # noqa: E402


def test_skewed_rollout_layout():
    """Prompts left-padded to the widest (32..96 tokens), responses right-padded, each row's
    real tokens contiguous; most responses are short (u**3 skew)."""
    exp = packing_bench.skewed_rollout(np.random.default_rng(0), prompts=8, rollout_n=4, min_len=20, max_len=1000, vocab=50)
    mask = exp.attention_mask.numpy()
    response = exp.response_mask.numpy().sum(1)
    prompt = mask[:, :exp.prompt_len].sum(1)
    assert len(exp) == 32 and (prompt >= 32).all() and (prompt <= 96).all() and (response >= 20).all()
    assert np.median(response) < 0.5 * response.max()  # skewed: the median well below the longest
    np.testing.assert_array_equal(mask.sum(1), prompt + response)
    np.testing.assert_array_equal(prompt.reshape(8, 4), prompt.reshape(8, 4)[:, :1].repeat(4, 1))  # one prompt per group
    np.testing.assert_allclose(exp.advantages.numpy()[:, 0].reshape(8, 4).mean(1), 0.0, atol=1e-5)  # group-whitened


def test_bench_reports_sft_and_grpo_sections():
    report = packing_bench.main(["--steps", "1", "--grpo_steps", "1", "--min_len", "8", "--max_len", "200",
                                 "--hidden", "32", "--layers", "1", "--batch", "6", "--grpo_prompts", "2"])
    for section in (report, report["grpo_update"]):
        assert section["real_tokens"] > 0
        assert section["packed"]["computed_tokens"] < section["padded"]["computed_tokens"]  # pad tokens skipped
        assert section["packed"]["computed_tokens"] >= section["real_tokens"]
        ratio = section["packed"]["real_tokens_per_s"] / section["padded"]["real_tokens_per_s"]
        np.testing.assert_allclose(section["speedup_packed_over_padded"], ratio)
