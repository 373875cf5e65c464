"""The sizing table in docs/distributed.md is `scripts/sizing.py`'s output, and the script's numbers are right."""
import os
import re

import pytest

from scripts.sizing import (GIB, LAYOUTS, MODELS, PUBLISHED, Layout, active_param_count, expert_param_count,
                            expert_weights_per_rank, fits, memory_gib, moe_table, param_count, table)

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "distributed.md")


def test_readme_table_is_the_scripts_output():
    text = open(README).read()
    block = re.search(r"<!-- SIZING:BEGIN -->\n(.*?)\n<!-- SIZING:END -->", text, re.S)
    assert block, "docs/distributed.md has no SIZING block"
    assert block.group(1).strip() == table().strip(), "run: python scripts/sizing.py and paste the table"
    block = re.search(r"<!-- SIZING-MOE:BEGIN -->\n(.*?)\n<!-- SIZING-MOE:END -->", text, re.S)
    assert block, "docs/distributed.md has no SIZING-MOE block"
    assert block.group(1).strip() == moe_table().strip(), "run: python scripts/sizing.py and paste the MoE table"


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


def test_qwen3_30b_a3b_totals_hand_computed():
    """Qwen3-30B-A3B's config.json: 48 layers, hidden 2048, 32 query / 4 KV heads of head_dim
    128 with per-head q/k norms, 128 experts, top-8, moe_intermediate 768, every layer sparse,
    vocabulary 151,936, untied. Per layer: attention 2048 (4096 + 2 x 512) + 4096 x 2048 =
    18,874,368, q/k norms 256, RMSNorms 4,096, router 2048 x 128 = 262,144, one expert
    3 x 2048 x 768 = 4,718,592; embeddings and LM head 2 x 151,936 x 2048, final norm 2048.
    Total 30,532,122,624 (the model card's 30.5B), active (8 experts) 3,353,032,704 (3.3B)."""
    shape = MODELS["Qwen3-30B-A3B"]
    layer = 18_874_368 + 256 + 4096 + 262_144
    outside = 2 * 151_936 * 2048 + 2048
    assert param_count(shape) == 48 * (layer + 128 * 4_718_592) + outside == 30_532_122_624
    assert active_param_count(shape) == 48 * (layer + 8 * 4_718_592) + outside == 3_353_032_704
    assert expert_param_count(shape) == 48 * 128 * 4_718_592
    assert round(param_count(shape) / 1e9, 1) == 30.5 and round(active_param_count(shape) / 1e9, 1) == 3.4


def test_mixtral_8x7b_matches_the_published_count():
    """Mixtral-8x7B: 46,702,792,704 parameters, 12,879,925,248 active (top-2 of 8)."""
    shape = MODELS["Mixtral-8x7B"]
    assert param_count(shape) == 46_702_792_704 and active_param_count(shape) == 12_879_925_248


def test_expert_parallel_divides_the_trained_experts_only():
    """SFT on Qwen3-30B-A3B at EP 8: a rank keeps 16 of the 128 experts of every layer, so its
    trained parameters are the 1,541,093,376 outside the routed experts plus 28,991,029,248 / 8;
    weights and gradients 2 bytes each, AdamW 12; GRPO's frozen reference keeps every expert;
    the rollout gathers the experts the rank does not hold."""
    shape = MODELS["Qwen3-30B-A3B"]
    experts = expert_param_count(shape)
    assert expert_weights_per_rank(shape, 8) == experts // 8 == 3_623_878_656
    held = 30_532_122_624 - experts + experts // 8
    assert held == 1_541_093_376 + 3_623_878_656
    m = memory_gib(Layout("SFT", "Qwen3-30B-A3B", tp=1, sharding=1, stage=1, micro_batch=1, seq_len=4096, ep=8))
    assert m["weights"] == m["grads"] == pytest.approx(held * 2 / GIB)
    assert m["optimizer"] == pytest.approx(held * 12 / GIB) and m["frozen"] == 0
    assert m["rollout_gather"] == pytest.approx((30_532_122_624 - held) * 2 / GIB)
    b, s, h = 1, 4096, 2048
    assert m["activations"] == pytest.approx((48 * b * s * h * 2 + b * s * h * 34 + 2 * b * s * 151_936 * 4
                                              + 2 * 8 * b * s * h * 2) / GIB)
    grpo = memory_gib(Layout("GRPO", "Qwen3-30B-A3B", tp=1, sharding=1, stage=1, micro_batch=1, seq_len=4096, ep=8))
    assert grpo["frozen"] == pytest.approx(30_532_122_624 * 2 / GIB) and grpo["optimizer"] == m["optimizer"]
    one = memory_gib(Layout("SFT", "Qwen3-30B-A3B", tp=1, sharding=1, stage=1, micro_batch=1, seq_len=4096))
    assert one["optimizer"] == pytest.approx(30_532_122_624 * 12 / GIB) and one["rollout_gather"] == 0
    with pytest.raises(ValueError, match="expert_parallel_degree 3 does not divide the 128 experts"):
        expert_weights_per_rank(shape, 3)
