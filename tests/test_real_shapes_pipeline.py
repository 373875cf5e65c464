"""Two steps each of SFT, RM, DPO, PPO and GRPO at 1,024-token sequences on the real shapes of
ppo.tiny.factory (1 layer, random weights): a Qwen2.5-0.5B-shaped Qwen2 (vocabulary 151,936)
and a Llama-3-shaped Llama (vocabulary 128,256), each with its own BPE tokenizer and chat
template, on long multi-turn conversations with a short final answer (batch of 1 sequence,
2 samples per prompt in GRPO). Until log-probs are taken in chunks, full logits over the
vocabulary make each step take tens of seconds here, so these are marked slow."""
import json
import os

import pytest

from ppo.data.encode import encode_exact
from ppo.tiny.chat_data import write_long_chat_data
from ppo.tiny.factory import build_real_shape
from tests import chat_pipeline as cp

pytestmark = pytest.mark.slow

SEQ = 1024
DEC = 4
OPENERS = {"qwen2.5-0.5b": "<|im_start|>assistant\n", "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n"}


@pytest.fixture(scope="module", params=sorted(OPENERS))
def shaped(request, tmp_path_factory):
    shape = request.param
    path = str(tmp_path_factory.mktemp(shape))
    tok, _ = build_real_shape(path, shape, num_layers=1, seed=1)
    data = write_long_chat_data(str(tmp_path_factory.mktemp(f"data_{shape}")), tok, prompt_tokens=SEQ - 16, num_records=2)
    with open(data["sft"]) as f:
        record = json.loads(f.readline())
    text = tok.apply_chat_template([[u, a] for u, a in zip(record["src"][:-1], record["tgt"][:-1])] + [[record["src"][-1]]],
                                   tokenize=False)
    n = len(encode_exact(tok, text))  # as the datasets encode it
    assert SEQ - 96 <= n <= SEQ - 16, n  # really a ~1k-token prompt (a conversation grows by whole turns)
    return shape, path, tok, data


@pytest.fixture(scope="module")
def rm_run(shaped, tmp_path_factory):
    shape, path, _, data = shaped
    out = str(tmp_path_factory.mktemp(f"rm_{shape}"))
    return out, cp.run_rm(path, data, out, max_length=SEQ)


def test_sft_two_steps(shaped, tmp_path):
    _, path, _, data = shaped
    records = cp.run_sft(path, data, str(tmp_path / "sft"), max_length=SEQ)
    assert [r["step"] for r in records] == [1, 2]


def test_rm_two_steps(rm_run):
    out, records = rm_run
    assert [r["step"] for r in records] == [1, 2]
    assert os.path.exists(os.path.join(out, "config.json"))


def test_dpo_two_steps(shaped, tmp_path):
    _, path, _, data = shaped
    records = cp.run_dpo(path, data, str(tmp_path / "dpo"), max_length=SEQ)
    assert [r["step"] for r in records] == [1, 2]


def test_ppo_two_steps(shaped, rm_run, tmp_path):
    shape, path, _, data = shaped
    out = str(tmp_path / "ppo")
    _, records = cp.run_ppo(path, rm_run[0], data, out, max_prompt_len=SEQ - DEC, max_dec_len=DEC)
    cp.assert_rl_run(records, out, OPENERS[shape], DEC)


def test_grpo_two_steps(shaped, tmp_path):
    from tests.test_reward_server import ServerProcess

    shape, path, _, data = shaped
    out = str(tmp_path / "grpo")
    server = ServerProcess("--scorer", "reverse", "--threads", "2")
    try:
        _, records = cp.run_grpo(path, server.url, data, out, max_prompt_len=SEQ - DEC, max_dec_len=DEC)
    finally:
        server.cleanup()
    cp.assert_rl_run(records, out, OPENERS[shape], DEC)
