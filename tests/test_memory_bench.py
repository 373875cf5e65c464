"""bench/memory_bench.py runs the trainer's step on a Qwen2-shaped model: the full-logits and
chunked runs give the same losses and report memory fields (a tiny vocabulary keeps it fast;
the memory numbers themselves are measured by running the bench, not here)."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("memory_bench", os.path.join(ROOT, "bench", "memory_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case, recompute", [pytest.param("ppo", False, marks=pytest.mark.slow), ("grpo", False),
                                             pytest.param("ppo", True, marks=pytest.mark.slow)])
def test_step_full_and_chunked_agree(bench, case, recompute, tmp_path):
    model_dir = bench.build_model_dir(str(tmp_path / "qwen"), num_layers=1, vocab_size=512)
    full = bench.run_case(model_dir, case, 0, batch=8, prompt_len=8, seq_len=20, warmup=False, recompute=recompute)
    chunked = bench.run_case(model_dir, case, 5, batch=8, prompt_len=8, seq_len=20, warmup=False, recompute=recompute)
    assert full["recompute"] is chunked["recompute"] is recompute
    assert full["response_tokens"] == chunked["response_tokens"] > 8 * 8
    assert abs(full["loss_policy"] - chunked["loss_policy"]) < 1e-5
    assert abs(full["entropy"] - chunked["entropy"]) < 1e-4 and 5.0 < full["entropy"] < 6.3  # ~ln 512 = 6.24
    for r in (full, chunked):
        assert r["step_peak_rss_mb"] >= r["rss_before_step_mb"] > 0 and r["step_s"] > 0
