"""Our rendering and tokenisation of Qwen3's and ERNIE 4.5's chat templates equal transformers'
`apply_chat_template` on the same tokenizer files (a byte-level BPE trained here, the family's
template tokens added as in the real checkpoints, the template in `tokenizer_config.json` or in
transformers 5's `chat_template.jinja`): plain chat, multi-turn with reasoning, tools and
`enable_thinking` on and off. Runs where a Python with transformers is found
(PADDLE_ALIGN_HF_PYTHON), through tests/hf_chat_template_check.py in a subprocess."""
import json
import os
import subprocess

import pytest

from ppo.tiny.family_chat import ERNIE45_TEMPLATE, QWEN3_ADDED, QWEN3_TEMPLATE
from tests.hf_weights_helpers import hf_python
from tests.test_family_chat_templates import HISTORY, SYSTEM, TOOL, USER

CALL = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "2"}]
CASES = [  # (messages, tools, add_generation_prompt, kwargs)
    (SYSTEM + USER, None, True, {}),
    (USER, None, True, {"enable_thinking": False}),
    (USER, None, True, {"enable_thinking": True}),
    (HISTORY, None, True, {}),
    (HISTORY + [{"role": "assistant", "content": "B", "reasoning_content": "r"}], None, False, {}),
    (USER + CALL, [TOOL], True, {"enable_thinking": False}),
]


def write_tokenizer(path, template, layout, ernie=False):
    """BPE files of `ppo.tiny.bpe_tokenizers` with the family's tokens and `template` in `layout`
    ("config": tokenizer_config.json; "jinja": chat_template.jinja)."""
    from ppo.tiny.bpe_tokenizers import build_qwen2_tokenizer

    build_qwen2_tokenizer(path, vocab_size=300)
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    decoder = config["added_tokens_decoder"]
    extra = ["<|begin_of_sentence|>", "<|end_of_sentence|>"] if ernie else list(QWEN3_ADDED)
    first = max(int(i) for i in decoder) + 1
    for i, token in enumerate(extra):
        decoder[str(first + i)] = {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                                   "single_word": False, "special": ernie}
    if ernie:
        config.update(cls_token="<|begin_of_sentence|>", sep_token="<|end_of_sentence|>")
        config["additional_special_tokens"] += extra
    if layout == "config":
        config["chat_template"] = template
    else:
        with open(os.path.join(path, "chat_template.jinja"), "w") as f:
            f.write(template)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


def ours(path, cases):
    from ppo.data.chat_templates import install_chat_template
    from ppo.data.encode import encode_exact
    from ppo.models.basics import load_tokenizer

    out = []
    for messages, tools, prompt, kwargs in cases:
        tok = load_tokenizer(path)
        template = tok.chat_template
        install_chat_template(tok, template.source, template.origin, kwargs)
        text = tok.chat_template.render(messages=messages, tools=tools, add_generation_prompt=prompt, **tok.special_tokens_map)
        out.append({"text": text, "ids": encode_exact(tok, text)})
    return out


@pytest.mark.skipif(hf_python() is None, reason="no Python with transformers (set PADDLE_ALIGN_HF_PYTHON)")
@pytest.mark.parametrize("family,layout", [("qwen3", "config"), ("qwen3", "jinja"), ("ernie45", "config")])
def test_rendering_and_ids_equal_transformers(family, layout, tmp_path):
    ernie = family == "ernie45"
    write_tokenizer(str(tmp_path / "tok"), ERNIE45_TEMPLATE if ernie else QWEN3_TEMPLATE, layout, ernie=ernie)
    cases = [c for c in CASES if not c[3] and not c[1]] if ernie else CASES
    jobs = [{"dir": str(tmp_path / "tok"), "messages": m, "tools": t, "add_generation_prompt": p, "kwargs": k}
            for m, t, p, k in cases]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    script = os.path.join(os.path.dirname(__file__), "hf_chat_template_check.py")
    subprocess.run([hf_python(), script, str(tmp_path / "jobs.json"), str(tmp_path / "out.json")], check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=600)
    theirs = json.loads((tmp_path / "out.json").read_text())
    mine = ours(str(tmp_path / "tok"), cases)
    assert len(theirs) == len(mine) == len(cases)
    for case, a, b in zip(cases, mine, theirs):
        assert a["text"] == b["text"], case
        assert a["ids"] == b["ids"], case
    if not ernie:
        assert "<think>\n\n</think>\n\n" in mine[1]["text"] and mine[2]["text"].endswith("assistant\n")
