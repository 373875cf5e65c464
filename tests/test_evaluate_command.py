"""The evaluation command (scripts/evaluate.py) on the tiny model, the PPO/GRPO loop's
eval_num_samples, and the GSM8K data preparation (scripts/prepare_gsm8k.py)."""
import json

import pytest

from tests.rule_reward_helpers import rule_argv


def run_evaluate(tiny_model_dir, tiny_data_dir, out, *extra):
    from scripts.evaluate import main

    argv = ["--model", tiny_model_dir, "--data", f"{tiny_data_dir}/test.jsonl", "--verifier", "reverse",
            "--max_new_tokens", "6", "--max_prompts", "12", "--batch_size", "5", "--output", str(out), *extra]
    main(argv)
    return json.load(open(out))


def test_greedy_samples_agree(tiny_model_dir, tiny_data_dir, tmp_path):
    """Greedy decoding: all 4 samples are one answer, so pass@1 = pass@2 = pass@4 = maj@4 = mean@4,
    and the per-prompt details hold 4 equal responses each."""
    result = run_evaluate(tiny_model_dir, tiny_data_dir, tmp_path / "greedy.json", "--greedy", "--num_samples", "4",
                          "--details")
    m = result["metrics"]
    assert set(m) == {"pass@1", "pass@2", "pass@4", "maj@4", "mean@4", "mean_score", "response_length"}
    assert m["pass@1"] == m["pass@2"] == m["pass@4"] == m["maj@4"] == m["mean@4"] == m["mean_score"]
    assert result["settings"]["num_prompts"] == 12 and len(result["prompts"]) == 12
    for record in result["prompts"]:
        assert len(set(record["responses"])) == 1 and len(record["correct"]) == 4
        assert record["correct"] == [r.strip() == record["label"].strip() for r in record["responses"]]
    assert 0 < m["response_length"] <= 6


def test_sampled_metrics_are_consistent_and_reproducible(tiny_model_dir, tiny_data_dir, tmp_path):
    """Sampling at temperature 2 with an exact-match judge that an untrained model never meets:
    against labels replaced by each prompt's first response, pass@k rises with k, maj@n <= pass@n,
    pass@1 = mean@n; the same seed gives the same file."""
    first = run_evaluate(tiny_model_dir, tiny_data_dir, tmp_path / "a.json", "--num_samples", "6", "--temperature",
                         "2.0", "--details", "--ks", "1,3,6")
    again = run_evaluate(tiny_model_dir, tiny_data_dir, tmp_path / "b.json", "--num_samples", "6", "--temperature",
                         "2.0", "--details", "--ks", "1,3,6")
    assert first["prompts"] == again["prompts"] and first["metrics"] == again["metrics"]
    records = first["prompts"]
    assert any(len(set(r["responses"])) > 1 for r in records)  # sampled, not greedy
    from ppo.evaluation.metrics import sampled_metrics

    own = [[resp == r["responses"][0] for resp in r["responses"]] for r in records]
    m = sampled_metrics(own, [r["answers"] for r in records], ks=[1, 3, 6])
    assert m["pass@6"] == 1.0 and m["pass@1"] <= m["pass@3"] <= m["pass@6"] and m["maj@6"] <= m["pass@6"]
    assert m["pass@1"] == pytest.approx(m["mean@6"])
    assert first["metrics"]["pass@1"] == pytest.approx(first["metrics"]["mean@6"])


def test_evaluate_refuses_bad_arguments(tiny_model_dir, tiny_data_dir, tmp_path, capsys):
    for extra, message in ((["--verifier", "nope"], "unknown scorer"), (["--ks", "9"], "--ks"),
                           (["--verifier", "length"], "says which answers are correct")):
        with pytest.raises(SystemExit):
            run_evaluate(tiny_model_dir, tiny_data_dir, tmp_path / "x.json", *extra)
        assert message in capsys.readouterr().err


def test_grpo_loop_reports_pass_at_k(tiny_model_dir, tiny_data_dir, tmp_path):
    """eval_num_samples 4 in the loop's evaluation: eval/pass@{1,2,4}, eval/maj@4, eval/mean@4
    beside the greedy eval/accuracy, correct by the rule scorer's verdict."""
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "grpo"), "--eval_num_samples", "4",
                                      "--rule_reward_scorers", "reverse"))
    metrics = trainer.evaluator.evaluate()
    for name in ("eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/maj@4", "eval/mean@4", "eval/accuracy"):
        assert 0.0 <= metrics[name] <= 1.0, name
    assert metrics["eval/pass@1"] == pytest.approx(metrics["eval/mean@4"])
    assert metrics["eval/pass@1"] <= metrics["eval/pass@2"] <= metrics["eval/pass@4"]
    with pytest.raises(ValueError, match="eval_num_samples"):
        build_trainer(rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "bad"), "--eval_num_samples", "-1"))


def test_prepare_gsm8k(tiny_model_dir, tmp_path):
    from scripts.prepare_gsm8k import INSTRUCTION, convert_file
    from tests.verifier_tables import GSM8K_FIRST

    src = tmp_path / "gsm8k.jsonl"
    rows = [{"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
                         "May. How many clips did Natalia sell altogether in April and May?", "answer": GSM8K_FIRST},
            {"question": "How many?", "answer": "It is 1,000 + 234 = 1,234.\n#### 1,234"}]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert convert_file(str(src), str(tmp_path / "out.jsonl")) == 2
    out = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    assert [o["tgt"] for o in out] == ["72", "1234"] and out[0]["src"].endswith(INSTRUCTION)
    assert out[1]["answer"] == rows[1]["answer"] and out[1]["index"] == 1
    assert convert_file(str(src), str(tmp_path / "q.jsonl"), template="qwen") == 2
    qwen = json.loads(open(tmp_path / "q.jsonl").readline())["src"]
    assert qwen.startswith("<|im_start|>system\n") and qwen.endswith("<|im_end|>\n<|im_start|>assistant\n")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q", "answer": "no final line"}) + "\n")
    with pytest.raises(SystemExit, match="line 1: the answer has no '#### n'"):
        convert_file(str(tmp_path / "bad.jsonl"), str(tmp_path / "o.jsonl"))
    from ppo.data import PromptOnlyDataset  # the output reads as Jsonfile prompts with their labels
    from ppo.models.loading import load_tokenizer
    from ppo.scorers import get_scorer

    data = PromptOnlyDataset([f"Jsonfile:1.0:{tmp_path / 'out.jsonl'}"], load_tokenizer(tiny_model_dir))
    assert sorted(data[i]["label"] for i in range(len(data))) == ["1234", "72"]
    assert get_scorer("gsm8k")(out[0]["src"], out[0]["tgt"], GSM8K_FIRST) == 1.0


def test_lora_adapter_checkpoint(tiny_model_dir, tiny_data_dir, tmp_path):
    """A LoRA adapter directory evaluates like a full model, with the adapter applied: with its B
    matrices set non-zero the greedy answers differ from the base model's."""
    import paddle

    from ppo.models.loading import apply_lora, load_causal_lm

    paddle.seed(3)
    lora = apply_lora(load_causal_lm(tiny_model_dir), rank=4, alpha=64, base_model_name_or_path=tiny_model_dir)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            param.set_value(paddle.randn(param.shape, dtype=param.dtype))
    lora.save_pretrained(str(tmp_path / "adapter"))
    base = run_evaluate(tiny_model_dir, tiny_data_dir, tmp_path / "base.json", "--greedy", "--details")
    adapted = run_evaluate(str(tmp_path / "adapter"), tiny_data_dir, tmp_path / "lora.json", "--greedy", "--details")
    assert [p["responses"] for p in adapted["prompts"]] != [p["responses"] for p in base["prompts"]]
    assert adapted["metrics"]["pass@1"] == adapted["metrics"]["mean@1"] and adapted["settings"]["num_prompts"] == 12
