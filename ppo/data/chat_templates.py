"""Jinja chat templates rendered as transformers renders them, from the checkpoint's own files.

PaddleNLP 3.0.0b4's tokenizer reads only `tokenizer_config.json`'s `chat_template` string (a
list of named templates fails to load, transformers 5's `chat_template.jinja` is not read) and
renders it in another Jinja environment: no `{% break %}` / `{% continue %}`, Jinja's own
`tojson` (HTML-escaped, keys sorted: a tool schema renders differently), a trailing newline kept,
and no way to pass `tools` or template arguments such as Qwen3's `enable_thinking`. Here:

- `checkpoint_template_source(path)`: the template of a model directory by transformers'
  rules: `chat_template.jinja` first, else `tokenizer_config.json`'s `chat_template` (a string,
  or the list of `{"name", "template"}` whose "default" entry is used);
- `compile_chat_template(source, origin, kwargs)`: a `ChatJinjaTemplate` compiled in
  transformers' environment (`transformers.utils.chat_template_utils`: trim_blocks,
  lstrip_blocks, loop controls, `tojson` as `json.dumps`, `raise_exception`, `strftime_now`),
  carrying the run's template arguments (`chat_template_kwargs`, e.g. `{"enable_thinking":
  false}`): every render passes them, after the tokenizer's special tokens, as transformers'
  `apply_chat_template(..., **kwargs)` does. Set as `tokenizer.chat_template`, it serves
  PaddleNLP's `apply_chat_template` and every caller that renders the template directly.

An argument the template never reads is refused by name (it would be accepted and ignored), as
is a template that does not compile (one error naming its file).
"""
import json
import os
from datetime import datetime

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..common.argument_problems import ArgumentError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
CALLER_SET = ("messages", "tools", "documents", "add_generation_prompt")
"""Template variables every render sets itself: not template arguments of a run."""
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""A message's reasoning under the names transformers fills from one another."""

__all__ = ["ChatJinjaTemplate", "compile_chat_template", "checkpoint_template_source", "template_kwargs_problems",
           "install_chat_template", "CALLER_SET"]


class ChatJinjaTemplate(jinja2.Template):
    """A compiled chat template that renders as transformers' `render_jinja_template`: `tools`
    and `documents` default to None, messages lose their None-valued keys and get their reasoning
    under every name in `REASONING_FIELDS`, and `template_kwargs` (the run's) are passed on every
    render. `origin` names where the template came from."""

    origin = "the chat template"
    template_kwargs = {}

    def render(self, *args, **kwargs):
        values = dict(*args, **kwargs)
        values.setdefault("tools", None)
        values.setdefault("documents", None)
        if isinstance(values.get("messages"), (list, tuple)):
            values["messages"] = [plain_message(m) for m in values["messages"]]
        values.update(self.template_kwargs)
        return super().render(values)


def plain_message(message):
    """`message` without None values, its reasoning under every name (transformers 5's aliasing)."""
    if not isinstance(message, dict):
        return message
    message = {k: v for k, v in message.items() if v is not None}
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.template_class = ChatJinjaTemplate
    return env


def template_variables(source):
    """The names a template reads from its caller (Jinja's undeclared variables)."""
    return meta.find_undeclared_variables(_environment().parse(source))


def template_kwargs_problems(kwargs, variables, origin):
    """Why `chat_template_kwargs` `kwargs` cannot be used with a template reading `variables`."""
    problems = []
    for key in kwargs:
        if key in CALLER_SET:
            problems.append(f"chat_template_kwargs: {key!r} is set by each render itself, not by the run")
        elif key not in variables:
            reads = sorted(set(variables) - set(CALLER_SET))
            problems.append(f"chat_template_kwargs: {key!r} is not read by {origin} (it reads {reads})")
    return problems


def compile_chat_template(source, origin="the chat template", kwargs=None):
    """A `ChatJinjaTemplate` of `source` with the run's template arguments `kwargs`. Raises
    ArgumentError naming `origin` when the template does not compile or an argument is not read."""
    kwargs = dict(kwargs or {})
    try:
        template = _environment().from_string(source)
        variables = template_variables(source)
    except jinja2.TemplateSyntaxError as err:
        raise ArgumentError(f"{origin}: not a Jinja chat template (line {err.lineno}: {err.message})") from None
    problems = template_kwargs_problems(kwargs, variables, origin)
    if problems:
        raise ArgumentError("; ".join(problems))
    template.origin, template.template_kwargs, template.source = origin, kwargs, source
    template.variables = frozenset(variables)
    return template


def _config_template(path):
    """`tokenizer_config.json`'s `chat_template` of directory `path` (None when absent)."""
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config_path):
        return None
    with open(config_path, encoding="utf-8") as f:
        value = json.load(f).get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ArgumentError(f"{config_path}: chat_template is neither a string nor a list holding a 'default' template")


def checkpoint_template_source(path):
    """`(source, origin)` of the chat template of model directory `path` by transformers' rules
    (module docstring), or `(None, None)` when it has none in those files."""
    jinja_path = os.path.join(path, TEMPLATE_FILE)
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read(), jinja_path
    source = _config_template(path)
    return (source, os.path.join(path, CONFIG_FILE)) if source is not None else (None, None)


def install_chat_template(tokenizer, source, origin, kwargs=None):
    """Set `tokenizer.chat_template` to `source` compiled with `kwargs` (see compile_chat_template);
    `save_pretrained` then writes `source` into `tokenizer_config.json` (a checkpoint keeps it)."""
    tokenizer.chat_template = compile_chat_template(source, origin, kwargs)
    if isinstance(getattr(tokenizer, "init_kwargs", None), dict):
        tokenizer.init_kwargs["chat_template"] = source
    return tokenizer


def bind_template_kwargs(tokenizer, kwargs):
    """Give the tokenizer's Jinja chat template the run's `chat_template_kwargs` (checked against
    what it reads). A tokenizer without a Jinja template refuses non-empty `kwargs`."""
    template = getattr(tokenizer, "chat_template", None)
    if not kwargs and not isinstance(template, ChatJinjaTemplate):
        return tokenizer
    if isinstance(template, ChatJinjaTemplate):
        return install_chat_template(tokenizer, template.source, template.origin, kwargs)
    if isinstance(template, jinja2.Template):
        raise ArgumentError("chat_template_kwargs: the tokenizer's chat template was compiled without its source; "
                            "load it with ppo.models.basics.load_tokenizer")
    raise ArgumentError(f"chat_template_kwargs {sorted(kwargs)}: the tokenizer has no Jinja chat template to pass them to")
