"""`scripts/chat.py`: the answers of a full model, a LoRA adapter and a run's `policy/` are the
rollout engine's own generations for the same prompt text (greedy, and sampled with the run's
settings and a seed); the prompt is formatted with the run's template or the tokenizer's chat
template; prompts come from flags, JSONL, text files and stdin; a score model is refused."""
import argparse
import io
import json
import os
import shutil
import subprocess
import sys

import paddle
import pytest

from ppo.data.collate import left_padding
from ppo.data.encode import encode_text
from ppo.evaluation import decode_responses
from ppo.models.loading import apply_lora, load_causal_lm, load_tokenizer
from ppo.rollout import RolloutEngine, SamplingParams
from scripts import chat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPTS = ["Reverse: abc", "Reverse: k3x9q", "Reverse: 0ab12"]
BEAVER = "BEGINNING OF CONVERSATION: USER: {input} ASSISTANT:"
TOY_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'user' %}<u>{{ message['content'] }}</u>"
                "{% else %}{{ message['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}")


def engine_answers(model, tokenizer, texts, params, seed=None, special_tokens=True):
    """The engine's answers to the prompt texts, all in one left-padded batch."""
    ids = [encode_text(tokenizer, t, add_special_tokens=special_tokens) for t in texts]
    engine = RolloutEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = engine.generate(left_padding(ids, tokenizer.pad_token_id), left_padding([[1] * len(r) for r in ids], 0),
                          params, seed=seed)
    return decode_responses(tokenizer, out.response_ids, out.response_mask)


def run_chat(argv, capsys, stdin=None):
    records = chat.main(argv, stdin=stdin)
    return records, capsys.readouterr().out


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter on the tiny model whose B matrices are far from zero (it changes answers),
    and the in-memory LoRAModel it was saved from."""
    paddle.seed(3)
    model = apply_lora(load_causal_lm(tiny_model_dir), rank=4, alpha=8, base_model_name_or_path=tiny_model_dir)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.set_value(paddle.randn(p.shape) * 0.5)
    path = str(tmp_path_factory.mktemp("chat_adapter"))
    model.save_pretrained(path)
    model.eval()
    return path, model


def test_a_full_model_answers_with_the_engines_greedy_generation(tiny_model_dir, tmp_path, capsys):
    out = str(tmp_path / "answers.jsonl")
    args = ["--model", tiny_model_dir, "--greedy", "--max_dec_len", "8", "--output", out]
    records, printed = run_chat(args + [a for p in PROMPTS for a in ("--prompt", p)] + ["--batch_size", "1"], capsys)
    tokenizer, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)
    params = SamplingParams(max_new_tokens=8, min_new_tokens=1, do_sample=False)
    want = [engine_answers(model, tokenizer, [BEAVER.replace("{input}", p)], params)[0] for p in PROMPTS]
    assert [r["response"] for r in records] == want and any(want)
    assert [r["prompt_text"] for r in records] == [BEAVER.replace("{input}", p) for p in PROMPTS]
    assert [json.loads(line) for line in open(out)] == records
    assert printed == "".join(f">>> {p}\n{w}\n" for p, w in zip(PROMPTS, want))


def test_a_lora_adapter_answers_with_its_adapter_on(adapter, tiny_model_dir, tmp_path, capsys):
    path, lora_model = adapter
    records, _ = run_chat(["--model", path, "--greedy", "--max_dec_len", "8"] + [a for p in PROMPTS for a in ("--prompt", p)],
                          capsys)
    tokenizer = load_tokenizer(tiny_model_dir)
    params = SamplingParams(max_new_tokens=8, min_new_tokens=1, do_sample=False)
    texts = [BEAVER.replace("{input}", p) for p in PROMPTS]
    want = engine_answers(lora_model, tokenizer, texts, params)
    assert [r["response"] for r in records] == want
    base = engine_answers(load_causal_lm(tiny_model_dir), tokenizer, texts, params)
    assert want != base  # the adapter changes the answers: a loader that dropped it would fail above


def write_run(tmp_path, model_dir, data_args, training_args):
    """A PPO-like output_dir: the model as `policy/` and a `resolved_arguments.json`."""
    run = tmp_path / "ppo"
    shutil.copytree(model_dir, run / "policy")
    (run / "resolved_arguments.json").write_text(json.dumps(
        {"DataArgument": data_args, "ModelArgument": {}, "PPOTrainingArguments": training_args}))
    return str(run)


def test_a_run_dir_samples_with_its_training_settings(tiny_model_dir, tmp_path, capsys):
    settings = {"max_dec_len": 6, "min_dec_len": 2, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.2}
    run = write_run(tmp_path, tiny_model_dir, {"prompt_template": "Q: {input} A:", "use_chat_template": False}, settings)
    records, _ = run_chat(["--model", run, "--seed", "7", "--top_k", "4"] + [a for p in PROMPTS for a in ("--prompt", p)], capsys)
    texts = [f"Q: {p} A:" for p in PROMPTS]
    assert [r["prompt_text"] for r in records] == texts
    params = SamplingParams(max_new_tokens=6, min_new_tokens=2, temperature=0.7, top_k=4, top_p=0.9, repetition_penalty=1.2)
    want = engine_answers(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), texts, params, seed=7)
    assert [r["response"] for r in records] == want
    assert all(2 <= r["num_tokens"] <= 6 for r in records)
    other = engine_answers(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), texts,
                           SamplingParams(max_new_tokens=6, min_new_tokens=2, temperature=0.7, top_k=5, top_p=0.9,
                                          repetition_penalty=1.2), seed=7)
    assert other != want  # the --top_k flag over the run's 5 is what changed them


def test_the_tokenizers_chat_template_formats_the_prompt(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "templated"
    shutil.copytree(tiny_model_dir, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(dict(config, chat_template=TOY_TEMPLATE)))
    records, _ = run_chat(["--model", str(path), "--greedy", "--max_dec_len", "8", "--prompt", PROMPTS[1]], capsys)
    assert records[0]["prompt_text"] == f"<u>{PROMPTS[1]}</u>A:"
    tokenizer = load_tokenizer(str(path))
    want = engine_answers(load_causal_lm(str(path)), tokenizer, [records[0]["prompt_text"]],
                          SamplingParams(max_new_tokens=8, min_new_tokens=1, do_sample=False), special_tokens=False)
    assert records[0]["response"] == want[0]
    records, _ = run_chat(["--model", str(path), "--greedy", "--max_dec_len", "8", "--prompt", PROMPTS[1],
                           "--use_chat_template", "false"], capsys)
    assert records[0]["prompt_text"] == BEAVER.replace("{input}", PROMPTS[1])


def test_prompts_from_files_and_stdin(tiny_model_dir, tmp_path, capsys):
    jsonl, text = tmp_path / "p.jsonl", tmp_path / "p.txt"
    jsonl.write_text('{"src": "Reverse: abc", "tgt": "cba"}\n"Reverse: 12"\n\n{"prompt": "Reverse: xy"}\n')
    text.write_text("Reverse: abc\n\nReverse: 12\n")
    assert chat.read_prompts_file(str(jsonl)) == ["Reverse: abc", "Reverse: 12", "Reverse: xy"]
    assert chat.read_prompts_file(str(text)) == ["Reverse: abc", "Reverse: 12"]
    (tmp_path / "bad.jsonl").write_text('{"question": "a"}\n{"other": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2 has no field"):
        chat.read_prompts_file(str(tmp_path / "bad.jsonl"))
    records, _ = run_chat(["--model", tiny_model_dir, "--greedy", "--max_dec_len", "4"], capsys,
                          stdin=io.StringIO("Reverse: abc\nReverse: 12\n"))
    assert [r["prompt"] for r in records] == ["Reverse: abc", "Reverse: 12"]


def test_a_score_model_and_a_folder_without_a_model_are_refused(tiny_rm_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        chat.main(["--model", tiny_rm_dir, "--prompt", "x"])
    assert stop.value.code == 2 and "is a score model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        chat.main(["--model", str(tmp_path), "--prompt", "x"])
    assert stop.value.code == 2 and "holds no model" in capsys.readouterr().err


def test_help_answers_before_paddle_is_imported():
    code = ("import sys; from scripts import chat\ntry:\n    chat.parse_args(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('paddle' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert "--prompts_file" in out.stdout and "--repetition_penalty" in out.stdout
    assert out.stdout.strip().endswith("False")
    installed = subprocess.run([sys.executable, "-m", "ppo.cli", "chat", "--help"], cwd="/", capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=ROOT))  # paddle-align chat, as installed
    assert installed.returncode == 0 and "--prompts_file" in installed.stdout


def test_settings_come_from_the_flags_then_the_run_then_the_training_defaults():
    defaults = {"max_dec_len": 64, "min_dec_len": 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                "repetition_penalty": 1.0, "prompt_template": BEAVER}
    args = argparse.Namespace(prompt_template=None, use_chat_template=None, max_dec_len=None, min_dec_len=None,
                                   temperature=0.5, top_k=None, top_p=None, repetition_penalty=None)
    run = {"max_dec_len": 10, "temperature": 0.9, "top_k": None, "use_chat_template": True, "prompt_template": "Q: {input}"}
    sampling, template, chat_on = chat.choose_settings(args, run, defaults, has_chat_template=False)
    assert sampling == {"max_dec_len": 10, "min_dec_len": 1, "temperature": 0.5, "top_k": 0, "top_p": 1.0,
                        "repetition_penalty": 1.0}
    assert (template, chat_on) == ("Q: {input}", True)
    args.prompt_template = "X {input}"  # a template flag wins over the run's chat template
    assert chat.choose_settings(args, run, defaults, has_chat_template=True)[1:] == ("X {input}", False)
    args.prompt_template = None  # no run: the tokenizer's chat template where it has one
    assert chat.choose_settings(args, {}, defaults, has_chat_template=True)[1:] == (BEAVER, True)
    assert chat.choose_settings(args, {}, defaults, has_chat_template=False)[1:] == (BEAVER, False)
    sft_run = {"eval_max_new_tokens": 12, "max_dec_len": None}  # SFT/DPO: their held-out generation length
    assert chat.choose_settings(args, sft_run, defaults, has_chat_template=False)[0]["max_dec_len"] == 12


def test_a_qwen3_model_chats_with_its_template_and_enable_thinking(tmp_path, capsys):
    """The tiny Qwen3's own template (ppo.tiny.family_chat); `--chat_template_kwargs` reaches it
    (the prompt ends after Qwen3's empty think block) and a key it does not read stops with exit 2."""
    from ppo.tiny.factory import build_tiny

    path = str(tmp_path / "qwen3")
    build_tiny(path, seed=1, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, arch="qwen3")
    base = ["--model", path, "--greedy", "--max_dec_len", "2", "--prompt", "hi"]
    records, _ = run_chat(base, capsys)
    assert records[0]["prompt_text"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    records, _ = run_chat(base + ["--chat_template_kwargs", '{"enable_thinking": false}'], capsys)
    assert records[0]["prompt_text"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    with pytest.raises(SystemExit) as stop:
        run_chat(base + ["--chat_template_kwargs", '{"enable_thinkin": false}'], capsys)
    assert stop.value.code == 2 and "'enable_thinkin' is not read by" in capsys.readouterr().err
