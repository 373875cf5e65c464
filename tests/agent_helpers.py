"""Environments, tools and models for the agent tests (tests/test_agent_*.py); importable as
`tests.agent_helpers:Name` to test `module.path:Class` loading."""
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


def positions_of(trajectory, kind):
    """Token indices of the segments of `kind` in `trajectory`."""
    out, n = [], 0
    for s in trajectory.segments:
        if s.kind == kind:
            out += list(range(n, n + len(s.token_ids)))
        n += len(s.token_ids)
    return np.asarray(out, dtype=np.int64)

