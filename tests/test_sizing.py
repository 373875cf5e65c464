"""The sizing table in docs/distributed.md is `scripts/sizing.py`'s output, and the script's numbers are right."""
import os
import re

import pytest

from scripts.sizing import GIB, LAYOUTS, MODELS, PUBLISHED, Layout, fits, memory_gib, param_count, table

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "distributed.md")


def test_readme_table_is_the_scripts_output():
    text = open(README).read()
    block = re.search(r"<!-- SIZING:BEGIN -->\n(.*?)\n<!-- SIZING:END -->", text, re.S)
    assert block, "docs/distributed.md has no SIZING block"
    assert block.group(1).strip() == table().strip(), "run: python scripts/sizing.py and paste the table"


@pytest.mark.parametrize("name, published", [
    ("Llama-2-7B", 6_738_415_616), ("Llama-2-13B", 13_015_864_320), ("Llama-2-70B", 68_976_648_192),
    ("Qwen2.5-7B", 7_615_616_512), ("Qwen2.5-32B", 32_763_876_352),
])
def test_parameter_counts_match_the_published_checkpoints(name, published):
    assert param_count(MODELS[name]) == published


def test_hand_computed_ppo_llama_7b_tp8():
    """4 models of N = 6,738,415,616 parameters over TP 8: optimizer 2 N 12 / 8 bytes, trained
    weights and grads 2 N 2 / 8 each, frozen 2 N 2 / 8; activations with b = 2, s = 2048,
    h = 4096, L = 32, V = 32000: L b s h 2 + b s h (10 + 3) + 2 b s V / 8 4 bytes."""
    n = 6_738_415_616
    m = memory_gib(Layout("PPO", "Llama-2-7B", tp=8, sharding=1, stage=1, micro_batch=2, seq_len=2048))
    assert m["optimizer"] == pytest.approx(2 * n * 12 / 8 / GIB)
    assert m["weights"] == m["grads"] == m["frozen"] == pytest.approx(2 * n * 2 / 8 / GIB)
    b, s, h = 2, 2048, 4096
    assert m["activations"] == pytest.approx((32 * b * s * h * 2 + b * s * h * 13 + 2 * b * s * 32000 / 8 * 4) / GIB)
    assert m["train_total"] == pytest.approx(sum(m[k] for k in ("weights", "grads", "optimizer", "frozen", "activations")))
    assert m["rollout_gather"] == pytest.approx(n * 2 * 7 / 8 / GIB)


def test_sharding_stages_divide_what_they_shard():
    base = dict(recipe="GRPO", model="Qwen2.5-32B", tp=4, sharding=4, micro_batch=1, seq_len=1024)
    s1, s2, s3 = (memory_gib(Layout(stage=k, **base)) for k in (1, 2, 3))
    assert s1["optimizer"] == s2["optimizer"] == s3["optimizer"]
    assert s2["grads"] == pytest.approx(s1["grads"] / 4) and s2["weights"] == s1["weights"]
    assert s3["weights"] == pytest.approx(s1["weights"] / 4)
    assert s1["frozen"] == s3["frozen"]  # frozen models are not sharded


def test_recommended_and_published_layouts_train_within_80_gb():
    for layout in LAYOUTS + PUBLISHED:
        train_fits, _ = fits(layout)
        assert train_fits, layout
    too_small = Layout("PPO", "Llama-2-70B", tp=8, sharding=1, stage=1, micro_batch=1, seq_len=2048)
    assert not fits(too_small)[0]  # 70B PPO on 8 GPUs does not fit: the table's layout is needed
