"""The chat templates and template tokens of the Qwen3 and ERNIE 4.5 families, for the tiny
models of those families (`ppo.tiny.factory --arch qwen3|qwen3_moe|ernie45`) and the tests.

- `QWEN3_TEMPLATE`: the logic of the template in Qwen3's `tokenizer_config.json` (Qwen3-0.6B /
  Qwen3-30B-A3B, April 2025): ChatML turns; tools listed in the system turn, calls as
  `<tool_call>{...}</tool_call>`, tool answers as a user turn in `<tool_response>` tags; an
  assistant message after the last user query keeps its reasoning in `<think>\\n...\\n</think>\\n\\n`
  (from `reasoning_content`, or split off its content at `</think>`), earlier ones lose it; with
  `add_generation_prompt` the prompt ends `<|im_start|>assistant\\n`, followed by the empty think
  block `<think>\\n\\n</think>\\n\\n` when `enable_thinking` is false.
- `ERNIE45_TEMPLATE`: ERNIE-4.5-0.3B's: `cls_token` (`<|begin_of_sentence|>`) once, then
  `User: ...\\n`, `Assistant: ...` + `sep_token` (`<|end_of_sentence|>`), a system message as its
  text and a newline; the generation prompt `Assistant: ` (on unless the caller sets it false).

`FAMILY_CHAT[arch]`: `(template, special tokens, added non-special tokens, special-token
attributes)`: Qwen3's `<|im_start|>`, `<|im_end|>` are special (the tiny model's EOS stays `</s>`,
which its demo data ends answers with; Qwen3's own EOS is `<|im_end|>`), `<think>`, `</think>`,
`<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` are added tokens that are not
special (as in Qwen3's `added_tokens_decoder`: decoding with `skip_special_tokens` keeps them);
ERNIE 4.5's `<|begin_of_sentence|>` / `<|end_of_sentence|>` are its `cls_token` / `sep_token`.
"""
import json
import os


QWEN3_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

ERNIE45_TEMPLATE = """\
{%- if not add_generation_prompt is defined -%}
    {%- set add_generation_prompt = true -%}
{%- endif -%}
{%- if not cls_token is defined -%}
    {%- set cls_token = "<|begin_of_sentence|>" -%}
{%- endif -%}
{%- if not sep_token is defined -%}
    {%- set sep_token = "<|end_of_sentence|>" -%}
{%- endif -%}
{{- cls_token -}}
{%- for message in messages -%}
    {%- if message["role"] == "user" -%}
        {{- "User: " + message["content"] + "\\n" -}}
    {%- elif message["role"] == "assistant" -%}
        {{- "Assistant: " + message["content"] + sep_token -}}
    {%- elif message["role"] == "system" -%}
        {{- message["content"] + "\\n" -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "Assistant: " -}}
{%- endif -%}"""

QWEN3_SPECIAL = ("<|im_start|>", "<|im_end|>")
QWEN3_ADDED = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
ERNIE45_SPECIAL = ("<|begin_of_sentence|>", "<|end_of_sentence|>")

FAMILY_CHAT = {
    "qwen3": (QWEN3_TEMPLATE, QWEN3_SPECIAL, QWEN3_ADDED, {}),
    "qwen3_moe": (QWEN3_TEMPLATE, QWEN3_SPECIAL, QWEN3_ADDED, {}),
    "ernie45": (ERNIE45_TEMPLATE, ERNIE45_SPECIAL, (), {"cls_token": "<|begin_of_sentence|>",
                                                         "sep_token": "<|end_of_sentence|>"}),
}
FAMILY_CHAT["ernie45_moe"] = FAMILY_CHAT["ernie45"]  # a tiny ERNIE 4.5 MoE gets the dense template (a checkpoint: its own)


def add_family_chat(tokenizer, arch):
    """The family's template tokens after the vocabulary (special ones, then the added ones that are
    not special) and its special-token attributes (ERNIE 4.5's cls / sep)."""
    from ..data.chat_templates import install_chat_template

    template, special, added, attributes = FAMILY_CHAT[arch]
    extra = list(tokenizer.additional_special_tokens) + [t for t in special if t not in tokenizer.additional_special_tokens]
    tokenizer.add_special_tokens({"additional_special_tokens": extra, **attributes})
    tokenizer.add_tokens([t for t in added if t not in tokenizer.get_vocab()])
    install_chat_template(tokenizer, template, f"the {arch} chat template")


def write_chat_template(output_dir, template):
    """`chat_template` into the saved `tokenizer_config.json` (where PaddleNLP and transformers read it)."""
    path = os.path.join(output_dir, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["chat_template"] = template
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
