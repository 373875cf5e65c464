"""On-policy distillation (sft/run_distill.py): the on-policy schedule and batches, the tokenizer
refusal before any model loads, and tiny real runs (full, LoRA, top-k teacher, data parallel)
judged by what they wrote."""
import json

import numpy as np
import pytest

from sft.distill_arguments import tokenizer_problems
from sft.distill_sampling import on_policy_batch, on_policy_step, prompt_rows


def read_jsonl(path):
    return [json.loads(ln) for ln in open(path)]


@pytest.mark.parametrize("lmbda", [0.0, 0.25, 0.3, 0.5, 0.9, 1.0])
def test_on_policy_schedule_holds_the_fraction_on_every_prefix(lmbda):
    steps = [on_policy_step(k, lmbda) for k in range(200)]
    for n in range(1, 201):
        assert abs(sum(steps[:n]) - n * lmbda) < 1.0 + 1e-9, (lmbda, n)
    if lmbda == 0.5:
        assert steps[:4] == [False, True, False, True]


def test_prompt_rows_and_on_policy_batch_by_hand():
    """Row 0: prompt [5, 6], answer [7, 2]; row 1: prompt [5], answer [8] (padding 3, labels -100)."""
    ids = np.array([[5, 6, 7, 2], [5, 8, 3, 3]])
    labels = np.array([[-100, -100, 7, 2], [-100, 8, -100, -100]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    prompts = prompt_rows(ids, labels, mask)
    assert [p.tolist() for p in prompts] == [[5, 6], [5]]
    batch = on_policy_batch(prompts, np.array([[9, 2, 3], [4, 4, 2]]), np.array([2, 3]), pad_token_id=3)
    assert batch["input_ids"].tolist() == [[5, 6, 9, 2], [5, 4, 4, 2]]
    assert batch["labels"].tolist() == [[-100, -100, 9, 2], [-100, 4, 4, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    short = on_policy_batch(prompts, np.array([[9, 9], [2, 3]]), np.array([1, 1]), pad_token_id=3)
    assert short["input_ids"].tolist() == [[5, 6, 9], [5, 2, 3]] and short["labels"].tolist()[1] == [-100, 2, -100]


class FakeTokenizer:
    def __init__(self, vocab, eos=2):
        self.vocab, self.bos_token_id, self.eos_token_id, self.pad_token_id = vocab, 1, eos, 3

    def get_vocab(self):
        return dict(self.vocab)


def test_tokenizer_problems_name_both_tokenizers():
    same = {"a": 4, "b": 5}
    assert tokenizer_problems(FakeTokenizer(same), FakeTokenizer(dict(same)), "s", "t") is None
    msg = tokenizer_problems(FakeTokenizer(same), FakeTokenizer({"a": 4, "c": 5}), "stud/dir", "teach/dir")
    assert "FakeTokenizer (stud/dir)" in msg and "FakeTokenizer (teach/dir)" in msg and "('c', 5)" in msg
    assert "eos_token_id" in tokenizer_problems(FakeTokenizer(same), FakeTokenizer(same, eos=9), "s", "t")


def distill_argv(student, teacher, data_dir, out, *extra):
    return [
        "config/tiny/distill_argument.json",
        "--model_name_or_path", student, "--teacher_model_name_or_path", teacher,
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/sft.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--report_to", "none",
        "--max_steps", "16", "--per_device_train_batch_size", "16", "--logging_steps", "2", "--learning_rate", "1e-2",
        "--eval_steps", "16", "--save_steps", "16", "--warmup_steps", "0", "--max_dec_len", "8",
        *extra,
    ]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A 2-layer, 64-hidden random Llama with the tiny tokenizer: a larger teacher."""
    from ppo.tiny.factory import build_tiny

    path = str(tmp_path_factory.mktemp("teacher"))
    build_tiny(path, seed=5, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    return path


def test_different_tokenizer_is_refused_before_any_model_loads(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    from ppo.common.argument_problems import ArgumentError
    from ppo.tiny.factory import build_real_shape

    import sft.run_distill as run_distill

    other = str(tmp_path / "bpe_teacher")
    build_real_shape(other, "llama3", num_layers=1, small=True, tokenizer_vocab_size=300)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the tokenizers were compared")

    monkeypatch.setattr(run_distill, "load_causal_lm", no_model)
    with pytest.raises((ArgumentError, ValueError)) as info:
        run_distill.main(distill_argv(tiny_model_dir, other, tiny_data_dir, str(tmp_path / "out")))
    text = str(info.value)
    assert "different tokenizers" in text and "LlamaTokenizer" in text and other in text and tiny_model_dir in text


def test_distill_run_learns_the_teacher_and_writes_its_metrics(tiny_model_dir, teacher_dir, tiny_data_dir, tmp_path):
    """lmbda 0.5: every other step on-policy (the logged fraction says so); the JSD to a fixed
    teacher falls; the teacher's log-prob of the trained tokens rises; the student reloads."""
    from paddlenlp.transformers import AutoModelForCausalLM

    out = str(tmp_path / "distill")
    from sft.run_distill import main

    main(distill_argv(tiny_model_dir, teacher_dir, tiny_data_dir, out, "--lmbda", "0.5"))
    logs = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "distill/jsd" in r]
    assert len(logs) == 8
    for r in logs:
        for name in ("distill/jsd", "distill/teacher_logprob", "distill/on_policy_frac", "loss/distill"):
            assert np.isfinite(r[name]), (name, r)
        assert r["distill/on_policy_frac"] == 0.5  # steps 2k and 2k+1: one of each
        assert r["distill/jsd"] > 0 and r["loss/distill"] > 0  # the step means' mean, and the pooled token mean
    jsd = [r["distill/jsd"] for r in logs]
    assert jsd[-1] < 0.6 * jsd[0], jsd
    assert logs[-1]["distill/teacher_logprob"] > logs[0]["distill/teacher_logprob"]
    tokens = [r["distill/tokens"] for r in logs]
    assert all(b > a for a, b in zip(tokens, tokens[1:]))
    summary = json.load(open(f"{out}/summary.json"))
    assert summary["global_step"] == 16 and 0.0 <= summary["final_eval"]["eval/accuracy"] <= 1.0
    assert AutoModelForCausalLM.from_pretrained(out).config.hidden_size == 32


def test_lora_student_with_top_k_teacher_trains_only_the_adapter(tiny_model_dir, teacher_dir, tiny_data_dir, tmp_path):
    from paddlenlp.transformers import AutoModelForCausalLM

    from ppo.models.loading import load_causal_lm
    from sft.run_distill import main

    out = str(tmp_path / "lora")
    main(distill_argv(tiny_model_dir, teacher_dir, tiny_data_dir, out, "--use_lora", "true", "--lora_rank", "4",
                      "--teacher_top_k", "8", "--lmbda", "1.0", "--beta", "1.0", "--eval_with_do_generation", "false"))
    logs = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "distill/jsd" in r]
    assert all(r["distill/on_policy_frac"] == 1.0 for r in logs)
    assert logs[-1]["distill/jsd"] < logs[0]["distill/jsd"], [r["distill/jsd"] for r in logs]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    trained = load_causal_lm(out).state_dict()
    moved = False
    for name, value in trained.items():
        if "lora_B" in name:
            moved |= float(value.abs().sum()) > 0
        elif "lora_" not in name:
            np.testing.assert_array_equal(value.numpy(), base[name[len("model."):]].numpy(), err_msg=name)
    assert moved


@pytest.mark.slow
def test_on_policy_distill_dp2_matches_one_process(tiny_model_dir, teacher_dir, tiny_data_dir, tmp_path):
    """Two data ranks with half the batch each sample the same answers as one process (each row
    draws its own columns of the step's uniforms) and take the token mean over both ranks, so the
    losses, the distillation metrics and the weights agree."""
    from tests.test_data_parallel import one_and_two_process_runs
    from tests.test_tensor_parallel import assert_same_steps, assert_same_weights

    argv = distill_argv(tiny_model_dir, teacher_dir, tiny_data_dir, "unused", "--lmbda", "1.0", "--max_steps", "3",
                        "--logging_steps", "1", "--gradient_accumulation_steps", "2", "--eval_steps", "3",
                        "--save_steps", "3", "--per_device_eval_batch_size", "8", "--eval_max_new_tokens", "6",
                        "--overwrite_output_dir", "true")
    argv = [a for a in argv if a not in ("--output_dir", "unused", "--logging_dir", "unused/vdl")]
    out1, out2 = one_and_two_process_runs("sft/run_distill.py", argv, tmp_path, {"--per_device_train_batch_size": 8})
    assert_same_steps(out1, out2, "loss/distill", 3)
    one, two = ([r for r in read_jsonl(f"{o}/metrics.jsonl") if "distill/jsd" in r] for o in (out1, out2))
    for a, b in zip(one, two):
        for name in ("distill/jsd", "distill/teacher_logprob", "distill/response_length", "distill/tokens"):
            np.testing.assert_allclose(b[name], a[name], rtol=2e-5, err_msg=name)
    assert_same_weights(out1, out2)
