"""PaddleNLP's `chat_template` argument (ppo/data/chat_template_file.py): unset keeps the tokenizer's
template, `none` removes it, a directory means its chat_template.json, a file is read by the
tokenizer (PaddleNLP's JSON format) or as Jinja (.jinja); a missing path is an error."""
import json

import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.data import SupervisedDataset
from ppo.data.chat_template_file import apply_chat_template_setting, chat_template_problem
from tests.test_paddlenlp_dropin import entry_classes

JINJA = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture()
def tokenizer(tiny_model_dir):
    from ppo.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def test_missing_paths_are_problems(tmp_path):
    assert chat_template_problem(None) is None and chat_template_problem("none") is None and chat_template_problem("None") is None
    assert "does not exist" in chat_template_problem(str(tmp_path / "nope.json"))
    assert "has no chat_template.json" in chat_template_problem(str(tmp_path))
    with pytest.raises(ArgumentError, match="chat_template: .* does not exist"):
        parse_arguments(entry_classes("sft"), ["--output_dir", str(tmp_path), "--chat_template", str(tmp_path / "x.json")])


def test_none_removes_and_a_file_sets_the_template(tokenizer, tmp_path):
    tokenizer.init_chat_template(JINJA)
    apply_chat_template_setting(tokenizer, None)
    assert tokenizer.chat_template is not None  # unset: the tokenizer's own
    apply_chat_template_setting(tokenizer, "none")
    assert tokenizer.chat_template is None
    (tmp_path / "t.jinja").write_text(JINJA)
    apply_chat_template_setting(tokenizer, str(tmp_path / "t.jinja"))
    text = tokenizer.apply_chat_template([["hi"]], tokenize=False)
    assert text.startswith("<user>hi") and text.endswith("<assistant>")
    legacy = {"system": "", "conversation": ["[U]{{user}}[A]{{bot}}", ""], "query": "[U]{{query}}[A]"}
    (tmp_path / "chat_template.json").write_text(json.dumps(legacy))
    apply_chat_template_setting(tokenizer, str(tmp_path))  # a directory: its chat_template.json
    assert tokenizer.apply_chat_template([["hi"]], tokenize=False) == "[U]hi[A]"


def test_the_template_formats_prompts_through_dataset_kwargs(tokenizer, tmp_path):
    (tmp_path / "t.jinja").write_text(JINJA)
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"src": ["hi"], "tgt": ["yo"]}) + "\n")
    _, data_args, train = parse_arguments(entry_classes("sft"), ["--output_dir", str(tmp_path / "o"), "--chat_template",
                                                                 str(tmp_path / "t.jinja"), "--use_chat_template", "true"])
    ds = SupervisedDataset(f"Jsonfile:1:{data}", **data_args.dataset_kwargs(tokenizer, 1), max_length=200)
    prompt = [int(t) for t, lab in zip(ds[0]["input_ids"], ds[0]["labels"]) if lab == -100]
    assert tokenizer.decode(prompt).replace(" ", "").startswith("<user>hi")
