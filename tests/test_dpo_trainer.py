"""The DPO family end to end through `dpo/run_dpo.py main([...])` on a tiny model.

Each loss type trains a few dozen steps on 200 demo preference pairs from a random
tiny Llama and must log finite losses and a rising `rewards/accuracies` (policy ==
reference at step 0, so reference-based losses start at accuracy 0), leave the
reference weights (or the LoRA base weights) bit-identical, and write
`metrics.jsonl`, `summary.json` and `resolved_arguments.json`.
"""
import json
import math
import os
import types

import numpy as np
import paddle
import pytest

from dpo import run_dpo
from dpo.dpo_trainer import KTOCollator, answer_logprobs
from ppo.data import IGNORE_INDEX, PreferenceDataset

TEMPLATE = "USER: {input} ASSISTANT:"


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    from ppo.tiny.demo_data import generate
    from ppo.tiny.factory import build_tiny

    root = tmp_path_factory.mktemp("dpo")
    model_dir, data_dir = str(root / "model"), str(root / "data")
    build_tiny(model_dir, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    generate(data_dir, num_sft=10, num_preference=200, num_preference_eval=48, num_prompts=10, num_test=24)
    return types.SimpleNamespace(root=root, model=model_dir, data=data_dir)


def write_config(tiny, name, **overrides):
    out = str(tiny.root / name)
    config = {
        "model_name_or_path": tiny.model,
        "train_datasets": f"PKU-SafeRLHF/train:1.0:{tiny.data}/preference.jsonl",
        "eval_datasets": f"PKU-SafeRLHF/test:1.0:{tiny.data}/preference_eval.jsonl",
        "prompt_template": TEMPLATE,
        "max_length": 32,
        "output_dir": out,
        "logging_dir": os.path.join(out, "visualdl"),
        "report_to": "visualdl",
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 48,
        "max_steps": 36,
        "learning_rate": 1e-2,
        "lr_scheduler_type": "constant",
        "logging_steps": 4,
        "save_strategy": "no",
        "do_train": True,
        "seed": 7,
        "disable_tqdm": True,
    }
    config.update(overrides)
    path = str(tiny.root / f"{name}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path, out


def run(tiny, monkeypatch, name, *flags, **overrides):
    """`main([config.json, *flags])`; returns `(trainer, output_dir, weights_before, weights_after)`
    where the weights are those that must stay fixed (reference, or LoRA base)."""
    path, out = write_config(tiny, name, **overrides)
    seen = {}
    real_finish = run_dpo.finish_trainer_run

    def frozen_weights(trainer):
        if trainer.ref_model is not None:
            return {k: v.numpy().copy() for k, v in trainer.ref_model.state_dict().items()}
        return {k: v.numpy().copy() for k, v in trainer.model.state_dict().items() if "lora" not in k}

    def finish(trainer, args, tokenizer):
        seen["trainer"], seen["before"] = trainer, frozen_weights(trainer)
        summary = real_finish(trainer, args, tokenizer)
        seen["after"] = frozen_weights(trainer)
        return summary

    monkeypatch.setattr(run_dpo, "finish_trainer_run", finish)
    run_dpo.main([path, *flags])
    return seen["trainer"], out, seen["before"], seen["after"]


def read_metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_run(out, before, after, extra_keys=(), rising=True):
    records = read_metrics(out)
    train = [r for r in records if "loss/total" in r]
    assert len(train) >= 5
    for r in train:
        for key in ("loss/total", "loss/dpo", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", *extra_keys):
            assert math.isfinite(r[key]), (key, r)
    acc = [r["rewards/accuracies"] for r in train]
    assert not rising or np.mean(acc[-3:]) > acc[0] + 0.15, acc
    assert before.keys() == after.keys() and before
    for k in before:
        assert np.array_equal(before[k], after[k]), f"frozen weight {k} changed"
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert math.isfinite(summary["final"]["eval/preference_accuracy"])
    assert "eval/reward_margin" in summary["final_eval"]
    with open(os.path.join(out, "resolved_arguments.json")) as f:
        resolved = json.load(f)
    return records, summary, resolved


@pytest.mark.parametrize(
    "loss_type,overrides",
    [
        ("sigmoid", {"beta": 0.5, "label_smoothing": 0.1}),
        ("ipo", {"beta": 0.1, "learning_rate": 5e-3}),
        ("hinge", {"beta": 0.5}),
        ("kto", {"beta": 1.0, "learning_rate": 3e-3, "desirable_weight": 1.0, "undesirable_weight": 1.0}),
        ("kto_pair", {"beta": 0.5}),
        ("sppo_hard", {"beta": 0.5, "learning_rate": 5e-3}),
        ("nca_pair", {"beta": 0.5}),
        ("dpop", {"beta": 0.5, "dpop_lambda": 5.0}),
        ("sigmoid", {"beta": 0.5, "pref_loss_ratio": 0.5, "sft_loss_ratio": 0.5}),
    ],
)
def test_reference_losses_train_with_frozen_reference(tiny, monkeypatch, loss_type, overrides):
    name = loss_type + ("_ratio" if "pref_loss_ratio" in overrides else "")
    trainer, out, before, after = run(tiny, monkeypatch, name, loss_type=loss_type, **overrides)
    assert trainer.ref_model is not None
    extra = ("kto/kl",) if loss_type == "kto" else ("loss/sft",) if "sft_loss_ratio" in overrides else ()
    records, _, resolved = check_run(out, before, after, extra)
    if "pref_loss_ratio" in overrides:  # PaddleNLP: pref_loss_ratio * preference + sft_loss_ratio * NLL
        for r in (r for r in records if "loss/total" in r):
            np.testing.assert_allclose(r["loss/total"], 0.5 * r["loss/dpo"] + 0.5 * r["loss/sft"], rtol=1e-4)
    assert resolved["DPOTrainingArguments"]["loss_type"] == loss_type
    assert resolved["DPOTrainingArguments"]["beta"] == overrides["beta"]


@pytest.mark.parametrize("loss_type,overrides", [
        ("simpo", {"beta": 5.0, "simpo_gamma": 0.5, "learning_rate": 5e-3}),
        ("orpo", {"beta": 10.0, "learning_rate": 5e-3}),
    ])
def test_reference_free_losses_load_no_reference(tiny, monkeypatch, loss_type, overrides):
    trainer, out, _, _ = run(tiny, monkeypatch, loss_type, loss_type=loss_type, **overrides)
    assert trainer.ref_model is None
    initial = {k: v.numpy() for k, v in type(trainer.model).from_pretrained(tiny.model).state_dict().items()}
    records = read_metrics(out)
    train = [r for r in records if "loss/total" in r]
    assert all(math.isfinite(r["loss/total"]) for r in train)
    acc = [r["rewards/accuracies"] for r in train]
    assert np.mean(acc[-3:]) > np.mean(acc[:2]) + 0.15, acc
    if loss_type == "orpo":
        assert all(math.isfinite(r["orpo/nll_loss"]) for r in train)
    # the saved policy reloads and differs from where it started
    saved = type(trainer.model).from_pretrained(out).state_dict()
    assert any(not np.array_equal(saved[k].numpy(), initial[k]) for k in initial)


def test_lora_sft_term_and_generation_eval(tiny, monkeypatch):
    """LoRA policy: reference = adapter disabled (base weights frozen, no second model,
    reference log-probs equal the base model's); `sft_loss_ratio` logs `loss/sft`;
    generation eval prompts add exact-match metrics. (LoRA on this random 1-layer
    model learns the preference too slowly to assert a rising accuracy.)"""
    trainer, out, before, after = run(
        tiny,
        monkeypatch,
        "lora",
        "--eval_generation_datasets",
        f"Jsonfile:1.0:{tiny.data}/test.jsonl",
        use_lora=True,
        lora_rank=8,
        beta=0.5,
        sft_loss_ratio=0.5,
        learning_rate=3e-2,
        eval_max_new_tokens=8,
    )
    assert trainer.ref_model is None and type(trainer.model).__name__ == "LoRAModel"
    records, summary, _ = check_run(out, before, after, extra_keys=("loss/sft",), rising=False)
    assert any(abs(r["rewards/chosen"]) > 1e-3 for r in records if "loss/total" in r)
    # the reference is the base model; the adapter is back on afterwards
    from ppo.models.loading import load_causal_lm

    batch = next(iter(trainer.get_eval_dataloader()))
    args = (batch["better_input_ids"], batch["better_attention_mask"], batch["better_labels"])
    base = load_causal_lm(tiny.model)
    with paddle.no_grad():
        expected = answer_logprobs(base, *args)[0].numpy()
        ref = trainer.reference_logprobs(trainer.model, *args).numpy()
        policy = answer_logprobs(trainer.model, *args)[0].numpy()
    np.testing.assert_allclose(ref, expected, rtol=1e-5, atol=1e-4)
    assert np.abs(policy - expected).max() > 1e-3
    assert "eval/accuracy" in summary["final_eval"] and "eval/preference_accuracy" in summary["final_eval"]
    assert os.path.isfile(os.path.join(out, "eval_samples.jsonl"))
    assert os.listdir(os.path.join(out, "visualdl"))
    assert os.path.isfile(os.path.join(out, "lora_config.json"))


def test_sequence_logprobs_match_a_loop(tiny):
    """Sum over answer tokens of log_softmax(logits[:, :-1]) at labels[:, 1:]."""
    from ppo.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(tiny.model)
    model = load_causal_lm(tiny.model)
    ds = PreferenceDataset(f"PKU-SafeRLHF/test:1.0:{tiny.data}/preference_eval.jsonl", tokenizer, 32, TEMPLATE)
    batch = ds.get_collator()([ds[i] for i in range(4)])
    ids, mask, labels = batch["worse_input_ids"], batch["worse_attention_mask"], batch["worse_labels"]
    with paddle.no_grad():
        logps, lengths, _, _ = answer_logprobs(model, ids, mask, labels)
        logits = model(input_ids=ids, attention_mask=mask, return_dict=True).logits.numpy()
    lab = labels.numpy()
    for b in range(4):
        z = logits[b] - logits[b].max(-1, keepdims=True)
        logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
        ts = [t for t in range(lab.shape[1] - 1) if lab[b, t + 1] != IGNORE_INDEX]
        assert lengths.numpy()[b] == len(ts) > 0
        np.testing.assert_allclose(logps.numpy()[b], sum(logsm[t, lab[b, t + 1]] for t in ts), rtol=1e-4, atol=1e-4)


def test_kto_collator_builds_mismatched_pairs(tiny):
    from ppo.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny.model)
    ds = PreferenceDataset(f"PKU-SafeRLHF/test:1.0:{tiny.data}/preference_eval.jsonl", tokenizer, 32, TEMPLATE)
    samples = [ds[i] for i in range(3)]
    batch = KTOCollator(ds.get_collator(), max_length=32)(samples)
    examples = [(s[f"{side}_input_ids"], s[f"{side}_labels"]) for side in ("better", "worse") for s in samples]
    kl_ids, kl_labels, kl_mask = (batch[k].numpy() for k in ("kl_input_ids", "kl_labels", "kl_attention_mask"))
    assert kl_ids.shape[0] == 6
    for j, (ids, labels) in enumerate(examples):
        prompt = ids[labels == IGNORE_INDEX]
        prev_ids, prev_labels = examples[j - 1]
        answer = prev_ids[prev_labels != IGNORE_INDEX]
        n = len(prompt) + len(answer)
        assert kl_mask[j].sum() == n
        np.testing.assert_array_equal(kl_ids[j, :n], np.concatenate([prompt, answer]))
        np.testing.assert_array_equal(kl_labels[j, : len(prompt)], IGNORE_INDEX)
        np.testing.assert_array_equal(kl_labels[j, len(prompt) : n], answer)
        assert (kl_labels[j, n:] == IGNORE_INDEX).all()


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--loss_type", "dpo"], "loss_type must be one of"),
        (["--loss_type", "orpo", "--sft_loss_ratio", "1.0"], "orpo already includes"),
        (["--loss_type", "ipo", "--label_smoothing", "0.1"], "label_smoothing applies"),
        (["--loss_type", "kto", "--reference_free", "true"], "kto needs a reference"),
    ],
)
def test_bad_arguments_are_errors(tmp_path, flags, match):
    with pytest.raises(ValueError, match=match):
        run_dpo.main(["--model_name_or_path", "x", "--output_dir", str(tmp_path), *flags])
