"""A multi-turn rollout in the chat-template format (ppo/agents/formats.py, rollout.py) holds the
ids an inference server would see: the rendered conversation tokenised with the newline after
`<|im_end|>` kept (checked against the `tokenizers` library, Hugging Face's own tokenizer, built
from the same files), and the `<|im_end|>` that closes a tool-calling turn belongs to the policy:
it carries the model's log-prob and the policy loss has a non-zero gradient there, zero at
every glue and tool token. Where a Python with transformers is at hand (PADDLE_ALIGN_HF_PYTHON),
transformers' tokenizer is asked too."""
import json
import os
import subprocess
import unicodedata

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from ppo.agents import AgentSettings, ChatTemplateFormat, collate_trajectories, rollout_trajectories
from ppo.agents import tokenization_drift
from ppo.agents.tools import get_tool
from ppo.algos.losses import ppo_policy_loss
from ppo.data.encode import encode_exact
from ppo.rollout import RolloutEngine, SamplingParams
from ppo.rollout.multi_turn import prefill_logprobs
from tests.agent_helpers import chain_qwen2, positions_of
from tests.hf_weights_helpers import hf_python

CALL = "<tool_call>sq 7</tool_call>"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from ppo.tiny.bpe_tokenizers import build_qwen2_tokenizer

    path = str(tmp_path_factory.mktemp("qwen"))
    return build_qwen2_tokenizer(path, tool_calls=True), path


def hf_encode(tokenizer_dir, text):
    """`text`'s ids from the `tokenizers` library over the tokenizer's files, as Qwen2's
    tokenizer.json sets it up (NFC, the byte-level BPE, added tokens that strip nothing)."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

    from ppo.tiny.bpe_tokenizers import QWEN2_PATTERN

    tok = Tokenizer(models.BPE.from_file(os.path.join(tokenizer_dir, "vocab.json"),
                                         os.path.join(tokenizer_dir, "merges.txt")))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        added = json.load(f)["added_tokens_decoder"]
    tok.add_special_tokens([AddedToken(v["content"], lstrip=v["lstrip"], rstrip=v["rstrip"], normalized=False,
                                       special=True) for _, v in sorted(added.items(), key=lambda kv: int(kv[0]))])
    return tok.encode(unicodedata.normalize("NFC", text), add_special_tokens=False).ids


@pytest.fixture(scope="module")
def rollout(qwen):
    """Two tool-calling turns of a model that writes CALL after every `assistant\\n`."""
    tok, _ = qwen
    fmt = ChatTemplateFormat(tok)
    chain = encode_exact(tok, "\n") + encode_exact(tok, CALL)
    model = chain_qwen2(len(tok), chain)
    engine = RolloutEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, kernels="paddle")
    args = AgentSettings(env_name="tools", env_kwargs=json.dumps({"tools": ["sq"]}), max_turns=2, max_total_len=900,
                          max_tool_response_len=32)
    result = rollout_trajectories(engine, [{"src": "What is 7 squared?"}], args, fmt,
                                  SamplingParams(max_new_tokens=12, do_sample=False), seed=0)
    return fmt, engine, model, result.trajectories[0]


def test_the_ids_are_the_rendered_conversation_tokenised_as_at_inference(qwen, rollout):
    tok, path = qwen
    fmt, _, _, traj = rollout
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert traj.token_ids == hf_encode(path, traj.text) == encode_exact(tok, traj.text)
    assert [s.kind for s in traj.segments] == ["prompt", "policy", "glue", "tool", "glue", "policy"]
    assert traj.stop_reason == "max_turns" and [s.text for s in traj.segments if s.kind == "tool"] == ["49"]
    for turn in traj.policy_segments:  # the sampled call, then the template's end of turn as the policy's token
        assert turn.token_ids == encode_exact(tok, CALL) + [im_end] and turn.text == CALL + "<|im_end|>"
    newline = encode_exact(tok, "\n")
    assert traj.segments[2].text == "\n<|im_start|>user\n<tool_response>\n"
    assert traj.segments[2].token_ids[:2] == [newline[0], tok.convert_tokens_to_ids("<|im_start|>")]
    assert traj.messages[1] == {"role": "assistant", "content": CALL} and traj.messages[2]["content"] == "49"
    rendered = fmt.render(traj.messages, [get_tool("sq").function_schema()])
    assert rendered == traj.text + "\n"  # the template's last `\n` follows the turn the rollout ends with
    assert tokenization_drift(traj, fmt.encode_conversation) is None
    assert fmt.turn_end_ids == [im_end] and fmt.turn_end_text == "<|im_end|>"


def test_the_turn_end_carries_the_models_logprob(qwen, rollout):
    """The forced `<|im_end|>` follows `</tool_call>`, after which the model's logits are all 0:
    its log-prob is -log(V), as one prefill pass of the whole trajectory gives it."""
    tok, _ = qwen
    fmt, engine, model, traj = rollout
    ids = np.asarray(traj.token_ids)
    ends = np.flatnonzero(ids == tok.convert_tokens_to_ids("<|im_end|>"))
    policy = positions_of(traj, "policy")
    forced = np.intersect1d(ends, policy)
    assert len(forced) == 2
    reference = prefill_logprobs(engine, model, traj.token_ids)
    logprobs = traj.policy_logprobs()
    np.testing.assert_allclose(logprobs[forced], reference[forced - 1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logprobs[forced], -np.log(model.config.vocab_size), rtol=1e-4)


def test_the_policy_loss_trains_the_turn_end_and_never_the_environments_tokens(qwen, rollout):
    """The model's log-probs over the collated trajectory, a PPO loss with the policy mask:
    d loss / d log-prob is non-zero at every policy token (the turn ends included) and 0 at
    every glue and tool token."""
    tok, _ = qwen
    fmt, _, model, traj = rollout
    batch = collate_trajectories([traj], tok.pad_token_id)
    seq = paddle.to_tensor(batch.sequences)
    Tp = batch.sequences.shape[1] - batch.response_mask.shape[1]
    logits = model(input_ids=seq, return_dict=True).logits
    logp = F.log_softmax(logits[:, :-1].astype("float32"), axis=-1)
    token_lp = paddle.take_along_axis(logp, seq[:, 1:].unsqueeze(-1), axis=-1).squeeze(-1)[:, Tp - 1:]
    mask = paddle.to_tensor(batch.response_mask)
    advantages = paddle.to_tensor(np.linspace(0.5, 1.5, mask.shape[1], dtype="float32")[None])
    loss, _ = ppo_policy_loss(token_lp, token_lp.detach(), advantages, mask)
    (grad,) = paddle.grad(loss, [token_lp])
    grad = grad.numpy()[0]
    response = batch.sequences[0, Tp:]
    policy = batch.response_mask[0] == 1
    ends = response == tok.convert_tokens_to_ids("<|im_end|>")
    assert (ends & policy).sum() == 2 and (ends & ~policy).sum() == 1  # the tool turn's own <|im_end|> is glue
    assert np.all(grad[policy] != 0) and np.all(grad[ends & policy] != 0)
    assert np.all(grad[~policy] == 0)


def test_a_turn_that_ends_with_the_sampled_eos_is_not_closed_twice(qwen):
    """A model that writes `It is 49.<|im_end|>` (EOS) after every `assistant\\n`, answered by an
    environment without stop strings: each turn holds its one sampled `<|im_end|>` (log-prob
    near 0) and the glue after it starts with the newline, never with a second `<|im_end|>`."""
    from tests.agent_helpers import EchoEnv

    tok, path = qwen
    fmt = ChatTemplateFormat(tok)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    chain = encode_exact(tok, "\n") + encode_exact(tok, "It is 49.") + [im_end]
    engine = RolloutEngine(chain_qwen2(len(tok), chain), eos_token_id=im_end, pad_token_id=tok.pad_token_id,
                           kernels="paddle")
    result = rollout_trajectories(engine, [{"src": "What is 7 squared?"}], AgentSettings(max_turns=3, max_total_len=200),
                                  fmt, SamplingParams(max_new_tokens=12, do_sample=False), seed=0,
                                  env_factory=lambda: EchoEnv(turns=2))
    (traj,) = result.trajectories
    assert [s.kind for s in traj.segments] == ["prompt", "policy", "glue", "tool", "glue", "policy"]
    for turn in traj.policy_segments:
        assert turn.text == "It is 49.<|im_end|>" and turn.token_ids.count(im_end) == 1
        assert turn.logprobs[-1] > -1e-3  # sampled, not forced
    assert traj.segments[2].text == "\n<|im_start|>user\n<tool_response>\n"
    assert traj.token_ids[traj.prompt_length:].count(im_end) == 3  # two turns and the tool turn's close
    assert traj.token_ids == hf_encode(path, traj.text)


@pytest.mark.skipif(hf_python() is None, reason="no Python with torch and transformers (set PADDLE_ALIGN_HF_PYTHON)")
def test_transformers_tokenises_the_conversation_to_the_same_ids(qwen, rollout):
    """transformers' own tokenizer, loaded from the same directory, gives the trajectory's ids
    for its text (the text an inference server renders from the same messages)."""
    _, path = qwen
    _, _, _, traj = rollout
    script = ("import json, sys, transformers\n"
              "tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])\n"
              "print(json.dumps(tok(sys.stdin.read(), add_special_tokens=False)['input_ids']))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([hf_python(), "-c", script, path], input=traj.text, capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == traj.token_ids
