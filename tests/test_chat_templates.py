"""Real tokenizers and chat templates: the locally trained Qwen2- and Llama-3-style byte-level
BPE tokenizers (ppo.tiny.bpe_tokenizers) load through PaddleNLP's AutoTokenizer; multi-turn
`src`/`tgt` data with `use_chat_template` trains only the final assistant turn in every
dataset kind; SFT, RM, DPO, PPO and GRPO run 2 steps each through the entry points on small
models of both families (ppo.tiny.factory `small=True`)."""
import json
import os

import numpy as np
import pytest
from paddlenlp.transformers import AutoTokenizer, Llama3Tokenizer, Qwen2Tokenizer

from ppo.data.encode import encode_exact
from ppo.data import IGNORE_INDEX, PreferenceDataset, PromptOnlyDataset, SupervisedDataset
from ppo.tiny.bpe_tokenizers import (
    LLAMA3_PATTERN,
    QWEN2_PATTERN,
    build_tokenizer,
    train_byte_level_bpe,
    training_corpus,
)
from ppo.tiny.chat_data import write_long_chat_data
from ppo.tiny.factory import build_real_shape
from tests import chat_pipeline as cp

STYLES = {
    "qwen2": dict(shape="qwen2.5-0.5b", cls=Qwen2Tokenizer, eos="<|im_end|>", pad="<|endoftext|>",
                  opener="<|im_start|>assistant\n", after_answer="\n"),
    "llama3": dict(shape="llama3", cls=Llama3Tokenizer, eos="<|eot_id|>", pad="<|end_of_text|>",
                   opener="<|start_header_id|>assistant<|end_header_id|>\n\n", after_answer=""),
}
TURNS = [["What is the capital of France?", "The capital of France is Paris."],
         ["It's a test, isn't it? Reverse: k3x9q", "q9x3k"],
         ["Reverse: 0ab12", "21ba0"]]


@pytest.fixture(scope="module", params=sorted(STYLES))
def style(request):
    return request.param


@pytest.fixture(scope="module")
def tok_dir(style, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(f"tok_{style}"))
    build_tokenizer(style, path, vocab_size=1024, seed=0)
    return path


@pytest.fixture(scope="module")
def chat_files(style, tok_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"chat_{style}")
    records = [{"src": [u for u, _ in TURNS], "tgt": [a for _, a in TURNS]}]
    with open(path / "sft.jsonl", "w") as f:
        f.write(json.dumps(records[0]) + "\n")
    pref = {"dialogue": [t for u, a in TURNS[:-1] for t in (u, a)] + [TURNS[-1][0]],
            "answer": "21ba", "other_answer": TURNS[-1][1], "better": False}
    with open(path / "preference.jsonl", "w") as f:
        f.write(json.dumps(pref) + "\n")
    return {"sft": f"Jsonfile:1.0:{path}/sft.jsonl", "preference": f"json:1.0:{path}/preference.jsonl"}


# --------------------------------------------------------------------------- tokenizers
def test_autotokenizer_loads_the_paddlenlp_class_with_specials(style, tok_dir):
    spec = STYLES[style]
    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert type(tok) is spec["cls"]
    assert tok.eos_token == spec["eos"] and tok.pad_token == spec["pad"]
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"
    n_bpe = len(tok) - (3 if style == "qwen2" else 256)
    if style == "qwen2":  # as Qwen2.5: specials right after the BPE vocabulary
        assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [n_bpe, n_bpe + 1, n_bpe + 2]
        assert os.path.exists(os.path.join(tok_dir, "vocab.json")) and os.path.exists(os.path.join(tok_dir, "merges.txt"))
    else:  # as Llama 3: 256 specials after the ranks, <|eot_id|> the 10th
        assert len(tok) == n_bpe + 256 and tok.bos_token_id == n_bpe and tok.eos_token_id == n_bpe + 9
        assert tok.convert_tokens_to_ids("<|start_header_id|>") == n_bpe + 6
        assert os.path.exists(os.path.join(tok_dir, "tokenizer.model"))
    assert 600 <= n_bpe <= 1024  # byte alphabet (256) + merges learnt from the shipped text


def test_byte_level_round_trip_and_merges(style, tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    for text in ["The capital of France is Paris.", "Reverse: k3x9q", "ünïcödé ✓ 12345\n\ttabs", "  two  spaces"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    words = tok(" capital", add_special_tokens=False)["input_ids"]
    assert len(words) == 1  # a frequent word of the corpus is one merged token
    assert len(tok("ünïcödé", add_special_tokens=False)["input_ids"]) >= 7  # unseen bytes fall back to bytes


def test_paddlenlp_encoding_equals_the_trained_bpe(style, tok_dir):
    """The files written encode exactly as the `tokenizers` model they were trained as."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    pattern = QWEN2_PATTERN if style == "qwen2" else LLAMA3_PATTERN
    vocab, merges = train_byte_level_bpe(training_corpus(0), 1024, pattern)
    fast = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    fast.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok = AutoTokenizer.from_pretrained(tok_dir)
    lines = training_corpus(1)[:40] + ["Reverse: 0ab12 it's 2026, ok?"]
    for line in lines:
        assert tok(line, add_special_tokens=False)["input_ids"] == fast.encode(line).ids, line


def test_build_is_deterministic(style, tok_dir, tmp_path):
    build_tokenizer(style, str(tmp_path), vocab_size=1024, seed=0)
    for name in os.listdir(tok_dir):
        with open(os.path.join(tok_dir, name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), name


def test_chat_template_renders_the_real_format(style, tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    text = tok.apply_chat_template([["hi", "yo"], ["Reverse: ab"]], tokenize=False)
    if style == "qwen2":
        assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                        "<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>user\nReverse: ab<|im_end|>\n"
                        "<|im_start|>assistant\n")
    else:
        assert text == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nReverse: ab<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids(STYLES[style]["eos"])) == (4 if style == "qwen2" else 3)  # + the system turn


def test_unknown_style_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer style 'gpt2'"):
        build_tokenizer("gpt2", str(tmp_path))


# --------------------------------------------------------------------------- datasets
def _full_conversation_ids(tok, turns):
    """Token ids of the whole rendered conversation (every answer included)."""
    text = tok.apply_chat_template([list(t) for t in turns], tokenize=False, add_generation_prompt=False)
    return encode_exact(tok, text)  # as transformers tokenises it: the newline before <|im_start|> kept


def test_sft_labels_cover_only_the_final_assistant_turn(style, tok_dir, chat_files):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ds = SupervisedDataset(chat_files["sft"], tok, max_length=512, use_chat_template=True)
    item = ds[0]
    ids, labels = list(item["input_ids"]), list(item["labels"])
    trained = [i for i, l in enumerate(labels) if l != IGNORE_INDEX]
    assert trained == list(range(len(ids) - len(trained), len(ids)))  # one block at the end
    assert tok.decode([ids[i] for i in trained]) == TURNS[-1][1] + STYLES[style]["eos"]
    prompt = tok.decode(ids[: trained[0]])
    assert prompt.endswith(STYLES[style]["opener"]) and TURNS[0][1] in prompt and TURNS[1][1] in prompt
    # the same tokens as the whole rendered conversation (the template's tail after the last EOS aside)
    full = _full_conversation_ids(tok, TURNS)
    tail = STYLES[style]["after_answer"]
    n_tail = len(tok(tail, add_special_tokens=False)["input_ids"]) if tail else 0
    assert ids == full[: len(full) - n_tail]


def test_preference_pairs_share_the_prompt_and_train_only_answers(style, tok_dir, chat_files):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ds = PreferenceDataset(chat_files["preference"], tok, max_length=512, use_chat_template=True)
    item = ds[0]
    eos = STYLES[style]["eos"]
    for side, answer in (("better", TURNS[-1][1]), ("worse", "21ba")):  # better=False flips the record
        ids, labels = list(item[f"{side}_input_ids"]), list(item[f"{side}_labels"])
        trained = [i for i, l in enumerate(labels) if l != IGNORE_INDEX]
        assert tok.decode([ids[i] for i in trained]) == answer + eos
        assert tok.decode(ids[: trained[0]]).endswith(STYLES[style]["opener"])
    n_prompt = int(np.sum(item["better_labels"] == IGNORE_INDEX))
    np.testing.assert_array_equal(item["better_input_ids"][:n_prompt], item["worse_input_ids"][:n_prompt])


def test_prompt_only_ends_with_the_generation_prompt(style, tok_dir, chat_files):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ds = PromptOnlyDataset(chat_files["sft"], tok, max_prompt_len=512, use_chat_template=True)
    item = ds[0]
    assert item["label"] == TURNS[-1][1]
    decoded = tok.decode(list(item["input_ids"]))
    assert decoded.endswith(STYLES[style]["opener"]) and TURNS[1][1] in decoded
    assert list(item["input_ids"]) == encode_exact(tok, item["prompt"])
    if style == "qwen2":  # PaddleNLP's own tokenize drops the newline between <|im_end|> and <|im_start|>
        assert list(item["input_ids"]) != tok(item["prompt"], add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------- pipeline
@pytest.fixture(scope="module")
def small_model(style, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(f"small_{style}"))
    tok, _ = build_real_shape(path, STYLES[style]["shape"], num_layers=1, seed=3, small=True)
    data = write_long_chat_data(str(tmp_path_factory.mktemp(f"data_{style}")), tok, prompt_tokens=96, num_records=4)
    return path, tok, data


@pytest.fixture(scope="module")
def reverse_server():
    from tests.test_reward_server import ServerProcess

    server = ServerProcess("--scorer", "reverse", "--threads", "2")
    yield server
    server.cleanup()


def test_small_family_model_keeps_the_shape_features(style, small_model):
    from paddlenlp.transformers import AutoModelForCausalLM

    path, tok, _ = small_model
    model = AutoModelForCausalLM.from_pretrained(path)
    cfg = model.config
    assert cfg.vocab_size == len(tok) and cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.rope_theta == (1e6 if style == "qwen2" else 5e5)
    assert cfg.tie_word_embeddings == (style == "qwen2")


def test_sft_rm_dpo_ppo_grpo_two_steps_with_chat_template(style, small_model, reverse_server, tmp_path):
    model_dir, tok, data = small_model
    sft = cp.run_sft(model_dir, data, str(tmp_path / "sft"), max_length=128)
    assert [r["step"] for r in sft] == [1, 2]
    rm = cp.run_rm(model_dir, data, str(tmp_path / "rm"), max_length=128)
    assert [r["step"] for r in rm] == [1, 2]
    dpo = cp.run_dpo(model_dir, data, str(tmp_path / "dpo"), max_length=128)
    assert [r["step"] for r in dpo] == [1, 2]
    _, ppo = cp.run_ppo(model_dir, str(tmp_path / "rm"), data, str(tmp_path / "ppo"), max_prompt_len=124)
    cp.assert_rl_run(ppo, str(tmp_path / "ppo"), STYLES[style]["opener"], 4)
    _, grpo = cp.run_grpo(model_dir, reverse_server.url, data, str(tmp_path / "grpo"), max_prompt_len=124)
    cp.assert_rl_run(grpo, str(tmp_path / "grpo"), STYLES[style]["opener"], 4)


def test_factory_cli_builds_a_small_family_model(tmp_path, capsys):
    from ppo.tiny.factory import main, real_shape_model

    main(["--output_dir", str(tmp_path), "--shape", "llama3", "--small", "--num_layers", "1", "--seed", "2"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["shape"] == "llama3" and printed["parameters"] > 0
    meta = json.load(open(tmp_path / "tiny_factory.json"))
    assert meta == {"shape": "llama3", "small": True, "num_layers": 1, "seed": 2, "tokenizer_ids": meta["tokenizer_ids"]}
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == meta["tokenizer_ids"]
    with pytest.raises(ValueError, match=r"unknown override\(s\) \['hidden'\]"):
        real_shape_model("llama3", tok, hidden=64)
    with pytest.raises(ValueError, match="unknown shape 'gpt2'"):
        real_shape_model("gpt2", tok)
