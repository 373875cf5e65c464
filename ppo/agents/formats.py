"""How observations become tokens: the prompt, and the environment's turns between policy turns.

Two formats, chosen like the prompts of the single-turn runs (:func:`turn_format_for`):

- :class:`ChatTemplateFormat` (``use_chat_template``): the tokenizer's chat template renders
  the conversation. Tools go into the template's tool slot (its ``tools`` variable, as
  Qwen2.5's template lists them in the system turn and asks for ``<tool_call>{...}</tool_call>``);
  PaddleNLP's ``apply_chat_template`` does not pass ``tools``, so the template is rendered here
  with them. A template without a tool slot gets the tools described in a system message
  (``tool_system_text``). An assistant message ends with the template's end-of-turn tokens
  (``turn_end_ids``: the special tokens right after its content, Qwen's ``<|im_end|>``): they
  belong to the policy's turn (the rollout closes a turn that stopped at a stop string with
  them, as the policy's tokens). The text between two policy turns is the rest of what the
  template puts between an assistant message and the next tool (or user) message: for Qwen2.5,
  ``\\n<|im_start|>user\\n<tool_response>\\n`` + answer +
  ``\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n`` -- found by rendering placeholders.
  Every piece is tokenised as an inference server tokenises the rendered text
  (``encode_exact``: the newline after ``<|im_end|>`` is kept).
- :class:`TaggedFormat` (text templates, e.g. the tiny demo's ``USER: {input} ASSISTANT:``):
  the prompt is the template filled in; a tool's answer is appended inside the same assistant
  turn as ``<tool_response>answer</tool_response>`` and the policy goes on writing; a user
  turn is the template again after a space.

Every piece is tokenised on its own (``add_special_tokens`` only for a text-template prompt,
as the datasets encode prompts: its segment's text is the text without them); a tool's answer
longer than ``max_tokens`` tokens is cut to fit them with the ``...(truncated)`` notice at its
end. ``encode_conversation(text)`` encodes a whole conversation the same way, for the drift
check (``tokenization_drift``).
"""
import json

from ..data.encode import encode_exact, encode_text
from .tool_calls import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN
from .tools import TRUNCATED
from .trajectory import Segment

_PLACEHOLDERS = ("\u2063USER\u2063", "\u2063ASSISTANT\u2063", "\u2063OBSERVATION\u2063")


def decode_exact(tokenizer, ids):
    """The text of `ids` with nothing added or removed (no spaces around special tokens, no
    clean-up)."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False,
                            spaces_between_special_tokens=False)


def as_messages(observation):
    """A first observation as chat messages: a string is the user's message."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    return [dict(m) for m in observation]


def tool_system_text(tools):
    """Hermes-style tool description for templates without a tool slot."""
    lines = [json.dumps(t, ensure_ascii=False) for t in tools]
    return ("You may call one or more functions to assist with the user query.\n\nYou are provided with function "
            "signatures within <tools></tools> XML tags:\n<tools>\n" + "\n".join(lines) + "\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            f'{CALL_OPEN}{CALL_CLOSE} XML tags:\n{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
            f"{CALL_CLOSE}")


class _Format:
    turn_end_ids = ()  # the tokens that end an assistant turn (none in the tagged form)
    turn_end_text = ""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._glue = {}

    def piece(self, text, special=False):
        return encode_text(self.tokenizer, text, add_special_tokens=special)

    def fit(self, text, max_tokens):
        """(ids, text) of `text`, cut when longer than `max_tokens` tokens to at most that many,
        the TRUNCATED notice included; the ids are the text's own."""
        ids = self.piece(text)
        if len(ids) <= max_tokens:
            return ids, text
        keep = max_tokens - len(self.piece(TRUNCATED))
        while keep > 0:
            cut = decode_exact(self.tokenizer, ids[:keep]) + TRUNCATED
            cut_ids = self.piece(cut)
            if len(cut_ids) <= max_tokens:
                return cut_ids, cut
            keep -= 1
        return ids[:max_tokens], decode_exact(self.tokenizer, ids[:max_tokens])  # no room for the notice

    def observation_segments(self, observation, role, turn, max_tokens, tools=(), turn_closed=True):
        """[glue, observation, glue] segments for the environment's answer to policy turn `turn`;
        `turn_closed`: the turn ends with ``turn_end_ids`` (else they open the first glue: the
        template ends every assistant message with them)."""
        return self.messages_segments([{"role": role, "content": observation}], turn, max_tokens, tools, turn_closed)

    def messages_segments(self, messages, turn, max_tokens, tools=(), turn_closed=True):
        """Segments of several environment messages after policy turn `turn` (each tool call's
        answer its own message): glue, message, glue, message, ..., glue; each message cut to
        `max_tokens` tokens."""
        roles = tuple(m["role"] for m in messages)
        if roles not in self._glue:
            self._glue[roles] = self.glue_between(roles, tools)
        glue = list(self._glue[roles])
        glue[0] = glue[0] if turn_closed else self.turn_end_text + glue[0]
        segments = [Segment("glue", self.piece(glue[0]), glue[0], turn=turn)]
        for message, after in zip(messages, glue[1:]):
            ids, text = self.fit(str(message["content"]), max_tokens)
            segments += [Segment(message["role"], ids, text, turn=turn), Segment("glue", self.piece(after), after, turn=turn)]
        return [s for s in segments if s.token_ids or s.kind != "glue"]


class TaggedFormat(_Format):
    """Text-template prompts, tool answers inline in ``<tool_response>`` tags (module docstring)."""

    def __init__(self, tokenizer, prompt_template="{input}"):
        super().__init__(tokenizer)
        if "{input}" not in prompt_template:
            raise ValueError(f"prompt_template must have an {{input}} slot, got {prompt_template!r}")
        self.prompt_template = prompt_template

    def prompt_segments(self, observation, tools=()):
        messages = as_messages(observation)
        system = " ".join(m["content"] for m in messages if m["role"] == "system")
        user = "\n".join(m["content"] for m in messages if m["role"] != "system")
        text = (system + " " if system else "") + self.prompt_template.replace("{input}", user)
        return [Segment("prompt", self.piece(text, special=True), text)]

    def glue_texts(self, role, tools=()):
        if role == "tool":
            return RESPONSE_OPEN, RESPONSE_CLOSE
        before, _, after = self.prompt_template.partition("{input}")
        return " " + before, after

    def glue_between(self, roles, tools=()):
        """The texts before, between and after messages of `roles` (each in its own tags)."""
        pairs = [self.glue_texts(role, tools) for role in roles]
        return [pairs[0][0]] + [post + nxt[0] for (_, post), nxt in zip(pairs, pairs[1:])] + [pairs[-1][1]]

    def encode_conversation(self, text):
        """The ids of a whole conversation's text, encoded as its prompt was (special tokens added)."""
        return self.piece(text, special=True)


class ChatTemplateFormat(_Format):
    """The tokenizer's chat template, tools in its tool slot (module docstring)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        template = getattr(tokenizer, "chat_template", None)
        if template is None or not hasattr(template, "render"):
            raise ValueError(f"the tokenizer ({type(tokenizer).__name__}) has no jinja chat template; use a text "
                             "prompt_template (use_chat_template false)")
        self.template = template
        probe = [{"role": "user", "content": _PLACEHOLDERS[0]}]
        fake_tool = [{"type": "function", "function": {"name": "probe_tool", "description": "", "parameters": {}}}]
        self.has_tool_slot = "probe_tool" in self.render(probe, fake_tool, True)
        self.turn_end_ids, self.turn_end_text = self._turn_end()

    def piece(self, text, special=False):
        return encode_exact(self.tokenizer, text)

    def _turn_end(self):
        """(ids, text) of the special tokens the template puts right after an assistant
        message's content (Qwen's ``<|im_end|>``; none when it puts none)."""
        u, a, _ = _PLACEHOLDERS
        text = self.render([{"role": "user", "content": u}, {"role": "assistant", "content": a}])
        after = text[text.index(a) + len(a):] if a in text else ""
        ids, special = self.piece(after), set(self.tokenizer.all_special_ids)
        n = next((i for i, t in enumerate(ids) if t not in special), len(ids))
        end_text = decode_exact(self.tokenizer, ids[:n])
        return (list(ids[:n]), end_text) if after.startswith(end_text) else ([], "")

    def render(self, messages, tools=None, add_generation_prompt=False):
        return self.template.render(messages=messages, tools=list(tools) or None if tools else None,
                                    add_generation_prompt=add_generation_prompt, **self.tokenizer.special_tokens_map)

    def prompt_segments(self, observation, tools=()):
        messages = as_messages(observation)
        if tools and not self.has_tool_slot:
            system = tool_system_text(tools)
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + system}
            else:
                messages.insert(0, {"role": "system", "content": system})
        text = self.render(messages, tools if self.has_tool_slot else None, True)
        return [Segment("prompt", self.piece(text), text)]

    def glue_texts(self, role, tools=()):
        return tuple(self.glue_between((role,), tools))

    def glue_between(self, roles, tools=()):
        """The texts the template puts before, between and after messages of `roles` following
        an assistant turn (its end-of-turn tokens left out), found by rendering placeholders."""
        u, a, _ = _PLACEHOLDERS
        marks = [f"\u2063OBSERVATION{i}\u2063" for i in range(len(roles))]
        messages = [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        messages += [{"role": r, "content": m} for r, m in zip(roles, marks)]
        named = "/".join(sorted(set(roles)))
        try:
            text = self.render(messages, tools if self.has_tool_slot else None, True)
        except Exception as err:  # noqa: BLE001 - a template that refuses the role: say which
            raise ValueError(f"the chat template cannot render a {named!r} message after an assistant turn: {err}") from err
        at = [text.index(m) if text.count(m) == 1 else -1 for m in [a] + marks]
        if text.count(a) != 1 or min(at) < 0 or at != sorted(at):
            raise ValueError(f"the chat template does not render a {named!r} message's content once after the assistant's")
        between = text[at[0] + len(a):]
        if not between.startswith(self.turn_end_text):
            raise ValueError(f"the chat template does not end an assistant turn with {self.turn_end_text!r} before a "
                             f"{named!r} message")
        pieces, rest = [], between[len(self.turn_end_text):]
        for mark in marks:
            piece, _, rest = rest.partition(mark)
            pieces.append(piece)
        return pieces + [rest]

    def encode_conversation(self, text):
        """The ids of a whole conversation's text, as an inference server tokenises it."""
        return self.piece(text)


def turn_format_for(tokenizer, use_chat_template=False, prompt_template="{input}"):
    """The format of a run: the chat template's when `use_chat_template`, else the text template's."""
    return ChatTemplateFormat(tokenizer) if use_chat_template else TaggedFormat(tokenizer, prompt_template)
