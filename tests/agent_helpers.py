"""Environments, tools and models for the agent tests (tests/test_agent_*.py); importable as
`tests.agent_helpers:Name` to test `module.path:Class` loading."""
import os
import time

import numpy as np

from ppo.agents import Environment, ToolEnvironment, register_tool

PAD, EOS = 3, 2


class EchoEnv(Environment):
    """Answers every turn with `answer * (1 + record["i"] % 3)` after `record["sleep"]` seconds
    (a list: one per turn), reward 0.5 per answered turn and 1.0 at the end; done after
    `record["turns"]` (default `turns`) policy turns. Treats every turn's end (a stop string or the turn length) as a call."""

    stop_strings = []

    def __init__(self, turns=3, answer="ans"):
        self.turns, self.answer, self.k = turns, answer, 0

    def reset(self, record):
        self.record = record
        return record["src"]

    def step(self, action_text):
        sleep = self.record.get("sleep", 0.0)
        time.sleep(sleep[self.k] if isinstance(sleep, (list, tuple)) else sleep)
        self.k += 1
        if self.k >= self.record.get("turns", self.turns):
            return None, 1.0, True, {}
        call = {"name": "echo", "error": None, "timeout": False, "latency_ms": 0.0}
        return self.answer * (1 + self.record.get("i", 0) % 3), 0.5, False, {"tool_calls": [call]}


class ScriptedToolEnv(ToolEnvironment):
    """The tool environment with the policy's text replaced by `record["actions"][turn]` (the
    random test model cannot write tool calls; the tool environment's handling of each call
    is what is tested). Turns end at the turn length (no stop string)."""

    stop_strings = []

    def reset(self, record):
        self.actions, self.turn = list(record["actions"]), 0
        return super().reset(record)

    def step(self, action_text):
        action = self.actions[self.turn] if self.turn < len(self.actions) else "final answer"
        self.turn += 1
        return super().step(action)


class RaisingEnv(EchoEnv):
    def step(self, action_text):
        raise RuntimeError("environment bug")


class HangingEnv(EchoEnv):
    def step(self, action_text):
        time.sleep(30)


class NoStepEnv:
    def reset(self, record):
        return ""


class NeedsArgEnv(EchoEnv):
    def __init__(self, level):
        super().__init__()
        self.level = level


@register_tool("test_boom", schema={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]})
def boom(x):
    raise RuntimeError("the tool broke")


@register_tool("test_slow", timeout_s=0.3)
def slow(x):
    time.sleep(5)
    return "late"


@register_tool("test_loud")
def loud(x):
    return "y" * 5_000_000


@register_tool("test_upper")
def upper(text):
    """Upper-case a text."""
    return text.upper()


@register_tool("sq")
def square(n):
    """The square of an integer."""
    return str(int(n) ** 2)


@register_tool("test_exit")
def exits(x):
    os._exit(3)


@register_tool("test_hang", timeout_s=1.0)
def hangs(x):
    time.sleep(120)
    return "late"


@register_tool("test_chatty")
def chatty(x):
    print("printed, not returned")
    return {"answer": x, "n": [1, 2]}


@register_tool("test_returns", schema={"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]})
def returns(kind):
    """Returns a value of the kind asked for (None, a dict, bytes, bytes that are not UTF-8, a set)."""
    return {"none": None, "dict": {"b": 1, "a": [1.5, "x"]}, "bytes": "caf\u00e9".encode(), "bad_bytes": b"\xff\xfe",
            "set": {1}, "number": 7}[kind]


def plain_function(city, unit="C"):
    return f"{city}: 21 {unit}"


def tiny_llama(path, tool_tags=False, seed=7):
    from ppo.tiny.factory import build_tiny

    tok, model = build_tiny(str(path), seed=seed, tool_tags=tool_tags, hidden_size=64, num_layers=2, num_heads=4,
                            intermediate_size=128)
    model.eval()
    return tok, model


def random_qwen2(seed=3):
    """A Qwen2 over the tiny tokenizer's ids: grouped KV heads, non-zero q/k/v biases, tied embeddings."""
    import paddle
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1e6,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD)
    paddle.seed(seed)
    model = Qwen2ForCausalLM(cfg)
    rng = np.random.default_rng(seed)
    for layer in model.qwen2.layers:
        for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            lin.bias.set_value(rng.standard_normal(lin.bias.shape).astype("float32") * 0.05)
    model.eval()
    return model


def chain_qwen2(vocab_size, chain, scale=4.0, seed=5):
    """A Qwen2 that writes `chain` (token ids) after `chain[0]`: each of its layers adds nothing to
    the residual stream (o_proj and down_proj zero), so its logits depend on the current token
    only, and the LM head maps each chain token's (orthonormal) embedding to the next one's id
    with logit 8 * scale (every other logit near 0). After the chain's last token every logit is
    0 (uniform). The chain's tokens must differ."""
    import paddle
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    assert len(set(chain)) == len(chain), chain
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, eos_token_id=EOS, pad_token_id=PAD)
    paddle.seed(seed)
    model = Qwen2ForCausalLM(cfg)
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((vocab_size, 64)).astype("float32") * 0.1
    basis, _ = np.linalg.qr(rng.standard_normal((64, 64)))
    embed[list(chain)] = basis[: len(chain)].astype("float32")
    head = np.zeros((64, vocab_size), "float32")
    for cur, nxt in zip(chain, chain[1:]):
        head[:, nxt] = scale * basis[chain.index(cur)]
    model.qwen2.embed_tokens.weight.set_value(embed)
    model.lm_head.weight.set_value(head.reshape(model.lm_head.weight.shape))
    for layer in model.qwen2.layers:
        for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
            lin.weight.set_value(np.zeros(lin.weight.shape, "float32"))
    model.eval()
    return model


def positions_of(trajectory, kind):
    """Token indices of the segments of `kind` in `trajectory`."""
    out, n = [], 0
    for s in trajectory.segments:
        if s.kind == kind:
            out += list(range(n, n + len(s.token_ids)))
        n += len(s.token_ids)
    return np.asarray(out, dtype=np.int64)



def fails_on_tool_answer(src, tgt, response):
    """A rule scorer that cannot score a trajectory holding a tool's answer."""
    if "<tool_response>" in response:
        raise RuntimeError("cannot score a tool answer")
    return 0.0


def text_sum_scorer(src, tgt, response):
    """A graded rule scorer: the characters' code points summed, mod 97, over 97 (random responses
    score differently, so that group advantages are not 0)."""
    return sum(map(ord, response)) % 97 / 97.0
