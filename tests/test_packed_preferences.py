"""`zero_padding` for the reward model and the DPO family: a batch's sequences packed into rows
(`ppo.models.unpadded`) give the padded batch's scores, log-probs, losses and gradients."""
import json
import types

import numpy as np
import paddle
import pytest

from dpo.dpo_arguments import DataArgument
from dpo.dpo_trainer import DPOTrainer
from dpo.preference_objective import needs_reference
from dpo.run_dpo import build_preference_datasets
from ppo.algos import PREFERENCE_HYPERPARAMETERS, PREFERENCE_LOSSES, get_preference_loss
from ppo.models.loading import load_causal_lm, load_tokenizer
from ppo.models.score_model import AutoModelForScore
from rm.reward_trainer import reward_loss

TEMPLATE = "USER: {input} ASSISTANT:"


def gradients(model):
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(packed, padded):
    assert sorted(packed) == sorted(padded) and len(padded) > 5
    for name in padded:
        np.testing.assert_allclose(packed[name], padded[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def pairs(tiny_model_dir, tiny_data_dir):
    """`(dataset, tokenizer)`: the tiny preference pairs, tokenised as the DPO entry point does."""
    tokenizer = load_tokenizer(tiny_model_dir)
    data_args = DataArgument(train_datasets=[f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl"],
                             prompt_template=TEMPLATE, max_length=48)
    dataset, _, _ = build_preference_datasets(data_args, types.SimpleNamespace(loss_type="sigmoid", seed=0), tokenizer)
    return dataset


def spread(dataset, start, count=8):
    """`count` items from `dataset[start:start + 64]` whose lengths spread from short to long."""
    size = lambda i: sum(len(v) for k, v in dataset[i].items() if k.endswith("input_ids"))  # noqa: E731
    ranked = sorted(range(start, start + 64), key=size)
    return [dataset[i] for i in ranked[:: 64 // count]]


def lengths_vary(batch):
    real = np.concatenate([batch["better_attention_mask"].numpy().sum(1), batch["worse_attention_mask"].numpy().sum(1)])
    return real.max() - real.min() >= 5


def test_reward_loss_packed_equals_padded(tiny_rm_dir, pairs):
    """The training forward (normaliser statistics updated) packed and padded: the same loss,
    gradients and normaliser statistics."""
    batch = pairs.get_collator()(spread(pairs, 0))
    assert lengths_vary(batch)
    results = []
    for packed_length in (None, 48):
        model = AutoModelForScore.from_pretrained(tiny_rm_dir, normalizer_type="RunningMeanStd")
        model.train()
        loss, stats = reward_loss(model, batch, "sequence-wise", 0.01, packed_length=packed_length)
        loss.backward()
        results.append((float(loss), float(stats["rm/accuracy"]), gradients(model), float(model.normalizer_mean)))
    (pad_loss, pad_acc, pad_grads, pad_mean), (pack_loss, pack_acc, pack_grads, pack_mean) = results
    np.testing.assert_allclose([pack_loss, pack_mean], [pad_loss, pad_mean], rtol=1e-5)
    assert pack_acc == pad_acc and pad_mean != 0.0
    assert_same_grads(pack_grads, pad_grads)


def test_token_wise_reward_loss_is_refused_with_zero_padding():
    """The token-wise loss reads scores at padding positions (safe-rlhf), which packing drops."""
    from rm.reward_arguments import packing_problems

    data, token_wise = types.SimpleNamespace(zero_padding=True), types.SimpleNamespace(loss_type="token-wise")
    (problem,) = packing_problems(data, token_wise)
    assert problem.startswith("zero_padding with loss_type token-wise") and "set loss_type sequence-wise" in problem
    assert packing_problems(data, types.SimpleNamespace(loss_type="sequence-wise")) == []
    assert packing_problems(types.SimpleNamespace(zero_padding=False), token_wise) == []


def stub_trainer(loss_type, reference, packed_length):
    """A `DPOTrainer` without PaddleNLP's `Trainer` set-up: what `preference_loss` reads."""
    trainer = DPOTrainer.__new__(DPOTrainer)
    trainer.args = types.SimpleNamespace(loss_type=loss_type, logprob_chunk_size=16, world_size=1, pref_loss_ratio=1.0,
                                         sft_loss_ratio=0.0, **PREFERENCE_HYPERPARAMETERS)
    trainer.loss_fn = get_preference_loss(loss_type)
    trainer.use_reference = needs_reference(loss_type)
    trainer.ref_model = reference if trainer.use_reference else None
    trainer.packed_length = packed_length
    return trainer


PAIR_LOSSES = sorted(name for name, entry in PREFERENCE_LOSSES.items() if entry.data == "pairs")


@pytest.mark.parametrize("loss_type", PAIR_LOSSES)
def test_every_pair_loss_packed_equals_padded(tiny_model_dir, pairs, loss_type):
    """Policy (and reference, and KTO's mismatched pairs) forwards through the trainer's own
    `preference_loss`, packed into rows of 48 tokens and padded: the same loss, stats and
    gradients, for every loss of the registry that trains on pairs (DPO, IPO, SimPO, KTO, ...)."""
    assert {"sigmoid", "simpo", "kto", "orpo"} <= set(PAIR_LOSSES)
    paddle.seed(0)
    reference = load_causal_lm(tiny_model_dir)
    for p in reference.parameters():  # a reference away from the policy: non-zero log-ratios
        p.set_value(p + 0.02 * paddle.randn(p.shape, p.dtype))
    policy = load_causal_lm(tiny_model_dir)
    collator = pairs.get_collator()
    if get_preference_loss(loss_type).kl_point:
        from dpo.run_dpo import KL_COLLATORS

        collator = KL_COLLATORS["pairs"](collator, max_length=48)
    batch = collator(spread(pairs, 64))
    assert lengths_vary(batch)
    results = []
    for packed_length in (None, 48):
        policy.clear_gradients()
        loss, stats = stub_trainer(loss_type, reference, packed_length).preference_loss(policy, batch)
        loss.backward()
        results.append((float(loss), {k: float(v) for k, v in stats.items()}, gradients(policy)))
    (pad_loss, pad_stats, pad_grads), (pack_loss, pack_stats, pack_grads) = results
    np.testing.assert_allclose(pack_loss, pad_loss, rtol=1e-5)
    assert sorted(pack_stats) == sorted(pad_stats)
    for key in pad_stats:
        np.testing.assert_allclose(pack_stats[key], pad_stats[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert_same_grads(pack_grads, pad_grads)


def test_reward_entry_point_with_zero_padding_trains_like_padding(tiny_model_dir, tiny_data_dir, tmp_path):
    """`rm/run_reward.py` with `zero_padding true` logs the padded run's losses and saves its weights."""
    from rm.run_reward import main as run_reward

    def run(name, *extra):
        out = str(tmp_path / name)
        run_reward([
            "config/tiny/rm_argument.json", "--model_name_or_path", tiny_model_dir,
            "--train_datasets", f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl", "--eval_datasets", "",
            "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "3", "--logging_steps", "1",
            "--save_steps", "3", "--warmup_steps", "0", "--disable_tqdm", "true", "--loss_type", "sequence-wise", *extra,
        ])
        losses = [r["rm/loss"] for r in map(json.loads, open(f"{out}/metrics.jsonl")) if "rm/loss" in r]
        return losses, {k: v.numpy() for k, v in paddle.load(f"{out}/model_state.pdparams").items()}

    padded_losses, padded = run("padded")
    packed_losses, packed = run("packed", "--zero_padding", "true")
    assert len(packed_losses) == 3
    np.testing.assert_allclose(packed_losses, padded_losses, rtol=1e-5)
    for key in padded:  # AdamW moves a weight whose gradient is near zero by ~lr * sign: 1e-4 absolute
        np.testing.assert_allclose(packed[key], padded[key], rtol=1e-4, atol=1e-4, err_msg=key)


def test_zero_padding_is_refused_with_pipeline_parallel():
    from ppo.entry.trainer_entry_checks import zero_padding_problems

    on, off = types.SimpleNamespace(zero_padding=True), types.SimpleNamespace(zero_padding=False)
    (problem,) = zero_padding_problems(on, types.SimpleNamespace(pipeline_parallel_degree=2))
    assert problem.startswith("zero_padding packs rows with a 4-D attention mask") and "pipeline_parallel_degree 1" in problem
    assert zero_padding_problems(on, types.SimpleNamespace(pipeline_parallel_degree=1)) == []
    assert zero_padding_problems(off, types.SimpleNamespace(pipeline_parallel_degree=2)) == []


@pytest.mark.parametrize("config, train_data", [
    ("dpo", "PKU-SafeRLHF/train:1.0:{}/preference.jsonl"),  # pairs (DPO, with the sft_loss_ratio NLL)
    ("kto_unpaired", "trl-unpaired:1.0:{}/unpaired.jsonl"),  # unpaired answers, KTO's mismatched-pair KL point
    ("lipo", "paddlenlp-ranked:1.0:{}/ranked.jsonl"),  # ranked lists
])
def test_dpo_family_entry_point_with_zero_padding_trains_like_padding(tiny_model_dir, tiny_data_dir, tmp_path, config,
                                                                       train_data):
    """`dpo/run_dpo.py` with `zero_padding true` logs the padded run's losses, step by step."""
    from dpo.run_dpo import main as run_dpo

    def run(name, *extra):
        out = str(tmp_path / name)
        run_dpo([
            f"config/tiny/{config}_argument.json", "--model_name_or_path", tiny_model_dir,
            "--train_datasets", train_data.format(tiny_data_dir), "--eval_datasets", "", "--eval_generation_datasets", "",
            "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "3", "--logging_steps", "1",
            "--per_device_train_batch_size", "8", "--evaluation_strategy", "no", "--do_eval", "false",
            "--warmup_steps", "0", "--learning_rate", "1e-3", "--disable_tqdm", "true", *extra,
        ])
        return [r for r in map(json.loads, open(f"{out}/metrics.jsonl")) if "loss/total" in r]

    padded = run("padded")
    packed = run("packed", "--zero_padding", "true")
    assert len(packed) == len(padded) == 3
    for key in ("loss/total", "loss/dpo"):
        np.testing.assert_allclose([r[key] for r in packed], [r[key] for r in padded], rtol=1e-5, err_msg=key)
