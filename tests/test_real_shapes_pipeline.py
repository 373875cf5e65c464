"""Two steps each of SFT, RM, DPO, PPO and GRPO at 1,024-token sequences on the real shapes of
ppo.tiny.real_shapes (random weights, each with its own tokenizer and chat template): a
Qwen2.5-0.5B-shaped Qwen2 (vocabulary 151,936) and a Llama-3-shaped Llama (128,256), 1 layer
each; Qwen3-0.6B (151,936, q/k norms) and ERNIE-4.5-0.3B (103,424, interleaved RoPE), 1 layer
each; and Qwen3-30B-A3B's widths (hidden 2,048, 32 query / 4 KV heads of 128, experts 768 wide,
untied vocabulary) with 16 experts, top-4, on 2 layers (every stage with LoRA: `EXTRA`). On long multi-turn conversations with a
short final answer (batch of 1 sequence, 2 samples per prompt in GRPO). Each run logs finite
losses at steps 1 and 2 and saves a model of the real shape; the MoE runs log the router stats
(`moe/*`). Full logits over the vocabulary make each step take tens of seconds here, so these
are marked slow (seconds and peak memory per test: docs/testing.md)."""
import json
import os

import pytest

from ppo.data.encode import encode_exact
from ppo.tiny.chat_data import write_long_chat_data
from ppo.tiny.factory import REAL_SHAPES, build_real_shape
from tests import chat_pipeline as cp

pytestmark = pytest.mark.slow

SEQ = 1024
DEC = 4
QWEN_OPENER = "<|im_start|>assistant\n"
OPENERS = {"qwen2.5-0.5b": QWEN_OPENER, "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
           "qwen3-0.6b": QWEN_OPENER, "ernie4.5-0.3b": "Assistant: ", "qwen3-30b-a3b-e16": QWEN_OPENER}
LAYERS = {"qwen3-30b-a3b-e16": 2}  # 1 layer elsewhere
LORA = ("--use_lora", "true")
EXTRA = {"qwen3-30b-a3b-e16": LORA}
"""Flags per shape for every stage. The MoE shape's untied 151,936 x 2,048 embedding and head (622M
of its 811M weights) make full training need about 13 GB of weights, gradients and AdamW moments
before any activation: its full SFT was stopped at 14 GB resident with the machine's memory spent
(24 GB, shared), and fewer layers would save 1.5 GB of it. So every stage of it trains LoRA
adapters (attention and every expert; the reference is the policy with its adapter off, the
critic an adapter on the reward model) over the frozen real-shaped weights."""


@pytest.fixture(scope="module", params=sorted(OPENERS))
def shaped(request, tmp_path_factory):
    shape = request.param
    path = str(tmp_path_factory.mktemp(shape))
    tok, model = build_real_shape(path, shape, num_layers=LAYERS.get(shape, 1), seed=1)
    del model
    data = write_long_chat_data(str(tmp_path_factory.mktemp(f"data_{shape}")), tok, prompt_tokens=SEQ - 16, num_records=2)
    with open(data["sft"]) as f:
        record = json.loads(f.readline())
    text = tok.apply_chat_template([[u, a] for u, a in zip(record["src"][:-1], record["tgt"][:-1])] + [[record["src"][-1]]],
                                   tokenize=False)
    n = len(encode_exact(tok, text))  # as the datasets encode it
    assert SEQ - 96 <= n <= SEQ - 16, n  # really a ~1k-token prompt (a conversation grows by whole turns)
    return shape, path, tok, data


def assert_saved(out, shape, causal=True):
    """The run's saved model (its LoRA adapter on the shapes in `EXTRA`) has the real shape."""
    if EXTRA.get(shape) == LORA:
        cp.assert_real_shape_adapter(out, REAL_SHAPES[shape], LAYERS.get(shape, 1))
    else:
        cp.assert_real_shape_saved(out, REAL_SHAPES[shape], LAYERS.get(shape, 1), causal=causal)


def moe_logged(shape, records):
    if "num_experts" in REAL_SHAPES[shape]:
        cp.assert_router_stats(records)


@pytest.fixture(scope="module")
def rm_run(shaped, tmp_path_factory):
    shape, path, _, data = shaped
    out = str(tmp_path_factory.mktemp(f"rm_{shape}"))
    return out, cp.run_rm(path, data, out, max_length=SEQ, extra=EXTRA.get(shape, ()))


def test_sft_two_steps(shaped, tmp_path):
    shape, path, _, data = shaped
    out = str(tmp_path / "sft")
    records = cp.run_sft(path, data, out, max_length=SEQ, extra=EXTRA.get(shape, ()))
    assert [r["step"] for r in records] == [1, 2]
    moe_logged(shape, records)
    assert_saved(out, shape)


def test_rm_two_steps(shaped, rm_run):
    out, records = rm_run
    assert [r["step"] for r in records] == [1, 2]
    assert os.path.exists(os.path.join(out, "config.json"))
    moe_logged(shaped[0], records)
    assert_saved(out, shaped[0], causal=False)


def test_dpo_two_steps(shaped, tmp_path):
    shape, path, _, data = shaped
    out = str(tmp_path / "dpo")
    records = cp.run_dpo(path, data, out, max_length=SEQ, extra=EXTRA.get(shape, ()))
    assert [r["step"] for r in records] == [1, 2]
    moe_logged(shape, records)
    assert_saved(out, shape)


def test_ppo_two_steps(shaped, rm_run, tmp_path):
    shape, path, _, data = shaped
    out = str(tmp_path / "ppo")
    _, records = cp.run_ppo(path, rm_run[0], data, out, max_prompt_len=SEQ - DEC, max_dec_len=DEC,
                            extra=EXTRA.get(shape, ()))
    cp.assert_rl_run(records, out, OPENERS[shape], DEC)
    moe_logged(shape, records)
    assert_saved(os.path.join(out, "policy"), shape)
    assert_saved(os.path.join(out, "value"), shape, causal=False)


def test_grpo_two_steps(shaped, tmp_path):
    from tests.test_reward_server import ServerProcess

    shape, path, _, data = shaped
    out = str(tmp_path / "grpo")
    server = ServerProcess("--scorer", "reverse", "--threads", "2")
    try:
        _, records = cp.run_grpo(path, server.url, data, out, max_prompt_len=SEQ - DEC, max_dec_len=DEC,
                                 extra=EXTRA.get(shape, ()))
    finally:
        server.cleanup()
    cp.assert_rl_run(records, out, OPENERS[shape], DEC)
    moe_logged(shape, records)
    assert_saved(os.path.join(out, "policy"), shape)
