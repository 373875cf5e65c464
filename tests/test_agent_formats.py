"""Observations as tokens (ppo/agents/formats.py) and trajectories (trajectory.py): the chat
template's tool slot and tool turn (a Qwen2.5-style tokenizer), the tagged form of text
templates (the tiny tokenizer, with and without its opt-in tag tokens), the policy mask and
batch layout, and the drift check between the ids a trajectory holds and its re-tokenised
text -- with the exact differences where equality is impossible."""
import json

import numpy as np
import pytest

from ppo.agents import ChatTemplateFormat, Segment, TaggedFormat, Trajectory, collate_trajectories, policy_mask
from ppo.agents import tokenization_drift
from ppo.agents.tool_calls import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN
from ppo.agents.tools import get_tool
from ppo.tiny.factory import TOOL_TAGS, build_tokenizer

CALC = [get_tool("calculator").function_schema()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tokenizer(str(tmp_path_factory.mktemp("plain"))), build_tokenizer(str(tmp_path_factory.mktemp("tags")),
                                                                                   tool_tags=True)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from ppo.tiny.bpe_tokenizers import build_qwen2_tokenizer

    return build_qwen2_tokenizer(str(tmp_path_factory.mktemp("qwen")), tool_calls=True)


def test_tiny_tool_tags_are_opt_in_and_change_no_existing_text(tiny):
    plain, tags = tiny
    assert TOOL_TAGS == [CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE]
    assert len(plain) == 100 and len(tags) == 104
    assert tags.convert_tokens_to_ids(TOOL_TAGS) == [100, 101, 102, 103]
    for text in ["USER: Reverse: k3x9q ASSISTANT:q9x3k", "a <b> c </d>", "<tool> call_"]:
        assert plain(text)["input_ids"] == tags(text)["input_ids"]
    assert tags("<tool_call>calculator 1+1</tool_call>")["input_ids"][1] == 100


def _trajectory(fmt, tokenizer, policy_texts, answers, first="What is 12*34?"):
    """A trajectory assembled as the rollout assembles it, with each policy turn's ids being the
    format's own ids of `policy_texts[k]` (the ids a model would sample most canonically); a turn
    followed by an answer ends with the format's end-of-turn tokens (the rollout closes a turn
    that stopped at `</tool_call>` with them)."""
    traj = Trajectory(segments=fmt.prompt_segments(first, CALC))
    for k, text in enumerate(policy_texts):
        ids = fmt.piece(text)
        if k < len(answers):
            ids, text = ids + list(fmt.turn_end_ids), text + fmt.turn_end_text
        traj.segments.append(Segment("policy", ids, text, logprobs=[-1.0] * len(ids), turn=k))
        if k < len(answers):
            traj.segments += fmt.observation_segments(answers[k], "tool", k, 64, CALC)
            traj.rewards.append(0.0)
    return traj


def test_tagged_format_segments_and_no_drift(tiny):
    _, tags = tiny
    fmt = TaggedFormat(tags, "USER: {input} ASSISTANT:")
    traj = _trajectory(fmt, tags, ["<tool_call>calculator 12*34</tool_call>", "408</s>"], ["408"])
    assert [s.kind for s in traj.segments] == ["prompt", "policy", "glue", "tool", "glue", "policy"]
    assert traj.segments[2].token_ids == [102] and traj.segments[4].token_ids == [103]
    assert traj.segments[0].token_ids[0] == tags.bos_token_id and traj.text.startswith("USER: What is 12*34? ASSISTANT:")
    assert traj.response_text == "<tool_call>calculator 12*34</tool_call><tool_response>408</tool_response>408</s>"
    assert tokenization_drift(traj, fmt.encode_conversation) is None


def test_tagged_format_drift_when_the_policy_spells_a_tag_out(tiny):
    """The policy wrote `<tool_call>` character by character instead of the tag token: the text
    re-tokenises to the tag token. The trajectory keeps the generated ids; the check shows it."""
    _, tags = tiny
    plain_ids = [tags.convert_tokens_to_ids(c) for c in CALL_OPEN]
    fmt = TaggedFormat(tags, "USER: {input} ASSISTANT:")
    traj = _trajectory(fmt, tags, ["x"], [])
    traj.segments[-1] = Segment("policy", plain_ids, CALL_OPEN, logprobs=[-1.0] * len(plain_ids))
    drift = tokenization_drift(traj, fmt.encode_conversation)
    start = traj.prompt_length
    assert drift.position == start and drift.held == plain_ids[:6] and drift.retokenized == [100]
    assert traj.token_ids[start:] == plain_ids


def test_chat_template_tool_slot_prompt_and_tool_turn(qwen):
    fmt = ChatTemplateFormat(qwen)
    assert fmt.has_tool_slot
    prompt = fmt.prompt_segments("What is 12*34?", CALC)[0].text
    listed = json.dumps(CALC[0], sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e")
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n") and listed in prompt
    assert prompt.endswith("<|im_start|>user\nWhat is 12*34?<|im_end|>\n<|im_start|>assistant\n")
    assert fmt.turn_end_text == "<|im_end|>" and fmt.turn_end_ids == [qwen.convert_tokens_to_ids("<|im_end|>")]
    assert fmt.glue_texts("tool", CALC) == ("\n<|im_start|>user\n<tool_response>\n",
                                            "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert fmt.glue_texts("user", CALC) == ("\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
    cut = fmt.observation_segments("408", "tool", 0, 64, CALC, turn_closed=False)  # a turn cut at its length
    assert cut[0].text == "<|im_end|>\n<|im_start|>user\n<tool_response>\n" and cut[0].token_ids[0] == fmt.turn_end_ids[0]


def test_chat_template_conversation_renders_as_the_template_does(qwen):
    """The segments' text is the template's rendering of the same messages (up to the last
    policy turn, which ends with the generated EOS instead of the template's `<|im_end|>\\n`)."""
    fmt = ChatTemplateFormat(qwen)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
    traj = _trajectory(fmt, qwen, [call, "It is 408.<|im_end|>"], ["408"])
    messages = [{"role": "user", "content": "What is 12*34?"}, {"role": "assistant", "content": call},
                {"role": "tool", "content": "408"}, {"role": "assistant", "content": "It is 408."}]
    rendered = fmt.render(messages, CALC)
    assert rendered == traj.text + "\n"


def test_chat_template_ids_keep_the_whitespace_next_to_special_tokens(qwen):
    """A turn `<tool_call>\\n{...}\\n</tool_call>` right after the template's `assistant\\n`, as
    Qwen models write calls: the held ids keep every newline, as the rendered text tokenised by an
    inference server has them (no drift). PaddleNLP's own tokenisation of the same text drops the
    whitespace on both sides of special tokens (the prompt's last newline and the generated one,
    and the newline after each `<|im_end|>`): why the format encodes with `encode_exact`."""
    fmt = ChatTemplateFormat(qwen)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
    traj = _trajectory(fmt, qwen, [call, "It is 408.<|im_end|>"], ["408"])
    assert tokenization_drift(traj, fmt.encode_conversation) is None
    (newline,), (brace,) = fmt.piece("\n"), fmt.piece("{")
    start = traj.prompt_length
    assert traj.token_ids[start - 1: start + 3] == [newline, qwen.convert_tokens_to_ids(CALL_OPEN), newline, brace]
    paddlenlp = qwen(traj.text, add_special_tokens=False)["input_ids"]
    opened = max(i for i, t in enumerate(paddlenlp) if t == qwen.convert_tokens_to_ids(CALL_OPEN))  # the policy's call
    assert len(paddlenlp) < len(traj.token_ids) and paddlenlp[opened + 1] == brace and paddlenlp[opened - 1] != newline
    im_end = qwen.convert_tokens_to_ids("<|im_end|>")
    ends = [i for i, t in enumerate(traj.token_ids) if t == im_end]
    assert all(traj.token_ids[i + 1] == newline for i in ends[:-1])


def test_llama3_template_ends_a_turn_with_eot(tmp_path):
    """Llama 3's template: the end of an assistant turn is `<|eot_id|>`, and PaddleNLP's tiktoken
    tokenizer (which keeps whitespace) encodes as it always does."""
    from ppo.tiny.bpe_tokenizers import build_llama3_tokenizer

    tok = build_llama3_tokenizer(str(tmp_path))
    fmt = ChatTemplateFormat(tok)
    assert fmt.turn_end_ids == [tok.convert_tokens_to_ids("<|eot_id|>")] and fmt.turn_end_text == "<|eot_id|>"
    assert fmt.glue_texts("user") == ("<|start_header_id|>user<|end_header_id|>\n\n",
                                      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    text = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    assert fmt.piece(text) == tok(text, add_special_tokens=False)["input_ids"]


def test_template_without_tool_slot_gets_the_tools_in_a_system_message(tmp_path):
    from ppo.tiny.bpe_tokenizers import build_qwen2_tokenizer

    fmt = ChatTemplateFormat(build_qwen2_tokenizer(str(tmp_path)))
    assert not fmt.has_tool_slot
    text = fmt.prompt_segments("hi", CALC)[0].text
    assert text.startswith("<|im_start|>system\nYou may call one or more functions") and '"calculator"' in text
    assert fmt.glue_texts("tool") == ("\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n")


def test_policy_mask_and_batch_layout():
    seg = [Segment("prompt", [5, 6, 7]), Segment("policy", [8, 9], logprobs=[-0.5, -0.25]), Segment("glue", [1]),
           Segment("tool", [2, 2]), Segment("glue", [1]), Segment("policy", [10], logprobs=[-1.0], turn=1)]
    a = Trajectory(segments=seg, rewards=[0.5, 2.0])
    b = Trajectory(segments=[Segment("prompt", [5]), Segment("policy", [8, 9, 4], logprobs=[-1.0] * 3)], rewards=[1.0])
    assert policy_mask(a.segments).tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0, 1]
    assert a.prompt_length == 3 and a.turn_end_indices() == [4, 9]
    assert a.reward_positions("per_turn") == [(4, 0.5), (9, 2.0)] and a.reward_positions("final") == [(9, 2.5)]
    batch = collate_trajectories([a, b], pad_token_id=0, turn_reward_mode="per_turn")
    assert batch.sequences.tolist() == [[5, 6, 7, 8, 9, 1, 2, 2, 1, 10], [0, 0, 5, 8, 9, 4, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 10, [0, 0, 1, 1, 1, 1, 0, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 0, 0, 1], [1, 1, 1, 0, 0, 0, 0]]
    np.testing.assert_allclose(batch.response_logprobs[0], [-0.5, -0.25, 0, 0, 0, 0, -1.0])
    np.testing.assert_allclose(batch.rewards, [[0, 0.5, 0, 0, 0, 0, 2.0], [0, 0, 1.0, 0, 0, 0, 0]])
    assert batch.response_lengths.tolist() == [7, 3] and batch.last_policy_index.tolist() == [6, 2]
    record = a.as_record()
    assert [t["role"] for t in record["turns"]] == ["prompt", "assistant", "glue", "tool", "glue", "assistant"]
    assert record["rewards"] == [0.5, 2.0] and json.loads(json.dumps(record)) == record
    with pytest.raises(ValueError, match="1 log-probs for 2 tokens"):
        Segment("policy", [1, 2], logprobs=[-1.0])
    with pytest.raises(ValueError):
        Segment("tool", [1], logprobs=[-1.0])
