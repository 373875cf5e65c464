"""PaddleNLP's `chat_template` argument: which chat template the tokenizer formats prompts with
(`paddlenlp.trl.llm_utils.init_chat_template`'s rules).

- unset (None): the tokenizer's own template (its `chat_template.json` / `tokenizer_config.json`);
- `none` (any case): no chat template at all (the tokenizer's is removed);
- a directory: the `chat_template.json` inside it;
- a file: a PaddleNLP `chat_template.json` (`{"system", "conversation", "query"}`, read by the
  tokenizer's `init_chat_template`), or a `.jinja` file holding a Jinja template.

The template acts where prompts are formatted with `use_chat_template: true`. Unlike PaddleNLP,
a path that does not exist, or a directory without `chat_template.json`, is an error, not a
warning followed by the tokenizer's own template.
"""
import os

CHAT_TEMPLATE_FILE = "chat_template.json"

__all__ = ["CHAT_TEMPLATE_FILE", "chat_template_problem", "apply_chat_template_setting"]


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


def apply_chat_template_setting(tokenizer, value):
    """Set `tokenizer`'s chat template from the `chat_template` argument `value` (see the module
    docstring); returns the tokenizer. Raises ValueError naming the argument for a bad path or file."""
    if value is None:
        return tokenizer
    if str(value).lower() == "none":
        tokenizer.chat_template = None
        return tokenizer
    problem = chat_template_problem(value)
    if problem:
        raise ValueError(problem)
    path = _template_file(value)
    try:
        if path.endswith(".jinja"):
            with open(path, encoding="utf-8") as f:
                tokenizer.init_chat_template(f.read())
        else:
            tokenizer.init_chat_template(path)
    except Exception as err:  # noqa: BLE001 - any parse error of the file is the argument's problem
        raise ValueError(f"chat_template {value}: cannot read a chat template from {path} ({type(err).__name__}: {err})") from None
    return tokenizer
