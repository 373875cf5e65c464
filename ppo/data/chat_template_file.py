"""PaddleNLP's `chat_template` argument: which chat template the tokenizer formats prompts with
(`paddlenlp.trl.llm_utils.init_chat_template`'s rules).

- unset (None): the tokenizer's own template (its `chat_template.json` / `tokenizer_config.json`);
- `none` (any case): no chat template at all (the tokenizer's is removed);
- a directory: the `chat_template.json` inside it;
- a file: a PaddleNLP `chat_template.json` (`{"system", "conversation", "query"}`, read by the
  tokenizer's `init_chat_template`), a `.jinja` file holding a Jinja template, or a `.json` file
  of transformers' processor layout (`{"chat_template": "..."}`); Jinja templates are compiled
  and rendered as transformers does (`ppo.data.chat_templates`).

`chat_template_kwargs` (the template's own arguments, e.g. Qwen3's `{"enable_thinking": false}`)
are passed to every render of a Jinja template; a key the template does not read is refused.

The template acts where prompts are formatted with `use_chat_template: true`. Unlike PaddleNLP,
a path that does not exist, or a directory without `chat_template.json`, is an error, not a
warning followed by the tokenizer's own template.
"""
import json
import os

from ..common.argument_problems import ArgumentError
from .chat_templates import CALLER_SET, bind_template_kwargs, install_chat_template

CHAT_TEMPLATE_FILE = "chat_template.json"

__all__ = ["CHAT_TEMPLATE_FILE", "chat_template_problem", "chat_template_kwargs_problem", "apply_chat_template_setting"]


def _template_file(value):
    """The file a `chat_template` path names (a directory's `chat_template.json`)."""
    path = os.path.expanduser(value)
    return os.path.join(path, CHAT_TEMPLATE_FILE) if os.path.isdir(path) else path


def chat_template_problem(value):
    """Why `chat_template` cannot be used (None when it can)."""
    if value is None or str(value).lower() == "none":
        return None
    if not isinstance(value, str) or not value.strip():
        return f"chat_template must be a file, a directory holding {CHAT_TEMPLATE_FILE}, or 'none'; got {value!r}"
    path = _template_file(value)
    if not os.path.isfile(path):
        where = f"{value} has no {CHAT_TEMPLATE_FILE}" if os.path.isdir(os.path.expanduser(value)) else f"{value} does not exist"
        return f"chat_template: {where} (give the template file, a directory holding {CHAT_TEMPLATE_FILE}, or 'none')"
    return None


def chat_template_kwargs_problem(kwargs, use_chat_template):
    """Why `chat_template_kwargs` cannot be used whatever the template (None when it can)."""
    if not kwargs:
        return None
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        return f"chat_template_kwargs must be a JSON object of template arguments, got {kwargs!r}"
    if not use_chat_template:
        return "chat_template_kwargs is set but use_chat_template is false: no chat template renders the prompts"
    caller_set = sorted(set(kwargs) & set(CALLER_SET))
    return f"chat_template_kwargs: {caller_set} are set by each render itself, not by the run" if caller_set else None


def _jinja_source(path):
    """The Jinja text of a template file: a `.jinja` file, or a `.json` file of transformers'
    processor layout `{"chat_template": "..."}`; None for PaddleNLP's `chat_template.json`."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".jinja"):
        return text
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ArgumentError(f"chat_template {path}: not JSON ({err})") from None
    return data["chat_template"] if isinstance(data, dict) and isinstance(data.get("chat_template"), str) else None


def apply_chat_template_setting(tokenizer, value, kwargs=None):
    """Set `tokenizer`'s chat template from the `chat_template` argument `value` (see the module
    docstring) with the run's `chat_template_kwargs` `kwargs`; returns the tokenizer. Raises
    ArgumentError naming the argument or the file for a bad path, file or keyword."""
    if value is not None and str(value).lower() == "none":
        tokenizer.chat_template = None
        getattr(tokenizer, "init_kwargs", {}).pop("chat_template", None)  # not saved with the run's checkpoints
        if kwargs:
            raise ArgumentError("chat_template_kwargs: chat_template is 'none', so no template reads them")
        return tokenizer
    if value is None:
        return bind_template_kwargs(tokenizer, kwargs)
    problem = chat_template_problem(value)
    if problem:
        raise ArgumentError(problem)
    path = _template_file(value)
    source = _jinja_source(path)
    if source is not None:
        return install_chat_template(tokenizer, source, path, kwargs)
    try:
        tokenizer.init_chat_template(path)
    except Exception as err:  # noqa: BLE001 - any parse error of the file is the argument's problem
        raise ArgumentError(f"chat_template {value}: cannot read a chat template from {path} ({type(err).__name__}: {err})") from None
    if kwargs:
        raise ArgumentError(f"chat_template_kwargs: {path} is PaddleNLP's chat_template.json format, which takes no "
                            "template arguments (give a Jinja template)")
    return tokenizer
