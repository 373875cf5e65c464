"""Every loss beyond the pairwise DPO family trains the tiny model from its
`config/tiny/<loss>_argument.json` (paths and run length overridden) with finite, moving
metrics at their recorded values (tests/pinned_metrics.py), and data of the wrong kind is
refused by name before any model loads."""
import json
import math
import os
import types

import numpy as np
import pytest

from dpo import run_dpo
from tests.pinned_metrics import assert_pinned

NEW_LOSSES = ("cpo", "rdpo", "kto_unpaired", "bco", "rrhf", "lipo", "pro", "dro", "npo")
LEARNING_SIGN = {  # the metric that shows learning, and its direction (+1 rising)
    "cpo": ("rewards/accuracies", 1), "rdpo": ("rewards/accuracies", 1), "kto_unpaired": ("rewards/margins", 1),
    "rrhf": ("rewards/margins", 1), "bco": ("rewards/margins", 1), "dro": ("rewards/margins", 1),
    "lipo": ("rewards/accuracies", 1), "pro": ("rewards/accuracies", 1),
    "npo": ("rewards/rejected", -1),
}
# Each run's metrics at steps 2 and 24 are pinned (tests/fixtures/pinned_metrics.json). Measured
# spread: repeated runs (in and out of pytest-xdist) bit for bit equal; 2 threads or MKL's generic
# code path move them by at most 1.4e-5 (absolute; 1e-5 relative beyond 1e-6) for eight losses.
# LiPO's lambda weights amplify it: 3.1e-4 absolute on logps, 1.5e-4 relative on eval/reward_margin.
PIN_TOLERANCE = dict(rtol=3e-5, atol=1e-6)
PIN_TOLERANCE_BY_LOSS = {"lipo": dict(rtol=5e-4, atol=1e-6)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ppo.tiny.demo_data import generate
    from ppo.tiny.factory import build_tiny

    root = tmp_path_factory.mktemp("families")
    model_dir, data_dir = str(root / "model"), str(root / "data")
    build_tiny(model_dir, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    generate(data_dir, num_sft=10, num_preference=96, num_preference_eval=24, num_prompts=10, num_test=8)
    return types.SimpleNamespace(root=root, model=model_dir, data=data_dir)


def config_argv(tiny, config_name, out, **flags):
    """The shipped config `config_name`, its data paths moved to the fixture's data."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config", "tiny", f"{config_name}_argument.json")
    config = json.load(open(path))
    moved = {k: config[k].replace("outputs/tiny/data", tiny.data) for k in ("train_datasets", "eval_datasets")}
    settings = dict(
        moved, model_name_or_path=tiny.model, output_dir=out, logging_dir=os.path.join(out, "vdl"), max_steps=24,
        logging_steps=2, learning_rate=1e-2, warmup_steps=0, eval_steps=100, eval_with_do_generation=False,
        per_device_train_batch_size=16, per_device_eval_batch_size=24, disable_tqdm=True, seed=7,
    )
    settings.update(flags)
    return [path] + [item for k, v in settings.items() for item in (f"--{k}", str(v))]


def read_metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("loss_type", NEW_LOSSES)
def test_loss_trains_the_tiny_model(tiny, loss_type):
    out = str(tiny.root / loss_type)
    run_dpo.main(config_argv(tiny, loss_type, out))
    train = [r for r in read_metrics(out) if "loss/total" in r]
    assert len(train) == 12
    keys = ["loss/total", "loss/dpo", "rewards/rejected", "logps/rejected"]
    if loss_type != "npo":
        keys += ["rewards/chosen", "rewards/margins", "rewards/accuracies", "logps/chosen"]
    for r in train:
        for key in keys:
            assert math.isfinite(r[key]), (key, r)
    for key in keys:  # every metric moves
        assert len({r[key] for r in train}) > 1, (key, [r[key] for r in train])
    key, sign = LEARNING_SIGN[loss_type]  # the last four logs against the first (each log: 2 training batches)
    curve = [r[key] for r in train]
    assert sign * (np.mean(curve[-4:]) - curve[0]) > 0, (key, curve)
    with open(os.path.join(out, "summary.json")) as f:
        final_eval = json.load(f)["final_eval"]
    assert math.isfinite(final_eval["eval/loss"]) and "eval/rewards/rejected" in final_eval
    assert_pinned(loss_type, read_metrics(out), **PIN_TOLERANCE_BY_LOSS.get(loss_type, PIN_TOLERANCE))


@pytest.mark.parametrize(
    "loss_type, data, kind",
    [
        ("lipo", "PKU-SafeRLHF/train:1.0:{}/preference.jsonl", "holds pairs"),
        ("kto_unpaired", "paddlenlp-ranked:1.0:{}/ranked.jsonl", "holds lists"),
        ("npo", "paddlenlp-ranked:1.0:{}/ranked.jsonl", "holds lists"),
        ("sigmoid", "trl-unpaired:1.0:{}/unpaired.jsonl", "PreferenceDataset needs field(s) ['other_answer', 'better']"),
    ],
)
def test_wrong_data_kind_is_refused_by_name_before_models_load(tiny, monkeypatch, loss_type, data, kind):
    from ppo.strategy import TrainerLayout

    monkeypatch.setattr(TrainerLayout, "load_preference_policy", lambda *a, **k: pytest.fail("a model loaded"))
    out = str(tiny.root / f"refused_{loss_type}")
    argv = config_argv(tiny, "rrhf", out, loss_type=loss_type, train_datasets=data.format(tiny.data), eval_datasets="")
    with pytest.raises(ValueError) as info:
        run_dpo.main(argv)
    message = str(info.value)
    assert f"loss_type {loss_type!r} trains on" in message and kind in message, message


def test_ranked_and_unpaired_batches(tiny):
    from ppo.data import IGNORE_INDEX, RankedPreferenceDataset, RejectedOnlyDataset, UnpairedPreferenceDataset
    from ppo.models.loading import load_tokenizer

    tok = load_tokenizer(tiny.model)
    kw = dict(tokenizer=tok, max_length=32, prompt_template="USER: {input} ASSISTANT:")
    ranked = RankedPreferenceDataset(f"paddlenlp-ranked:1.0:{tiny.data}/ranked_eval.jsonl", **kw)
    assert len(ranked) == 24 and all(list(ranked[i]["scores"]) == [2.0, 1.0, 0.0] for i in range(len(ranked)))
    batch = ranked.get_collator()([ranked[0], ranked[1]])
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    assert ids.shape[0] == 6 and batch["scores"].shape == [2, 3] and batch["valid"].numpy().all()
    n = len(ranked[1]["input_ids"][2])
    np.testing.assert_array_equal(ids[2 * 2 + 1, :n], ranked[1]["input_ids"][2])  # row k*B+b = answer k of prompt b
    assert (labels[2 * 2 + 1, n:] == IGNORE_INDEX).all()
    unpaired = UnpairedPreferenceDataset(f"trl-unpaired:1.0:{tiny.data}/unpaired_eval.jsonl", **kw)
    assert [float(unpaired[i]["scores"][0]) for i in range(4)] == [1.0, 0.0, 1.0, 0.0]
    rejected = RejectedOnlyDataset(f"trl-unpaired:1.0:{tiny.data}/unpaired_eval.jsonl", **kw)
    assert len(rejected) == 12 and rejected.stats["skipped_desirable"] == 12


@pytest.mark.parametrize("loss_type", ["lipo", "kto_unpaired"])
def test_lora_policy_is_its_own_reference(tiny, monkeypatch, loss_type):
    """With `use_lora` no reference model loads: the reference log-probs (and KTO's KL point)
    come from the policy with its adapter off, and the base weights stay fixed."""
    seen = {}
    real_finish = run_dpo.finish_trainer_run

    def finish(trainer, args, tokenizer):
        base = {k: v.numpy().copy() for k, v in trainer.model.state_dict().items() if "lora" not in k}
        summary = real_finish(trainer, args, tokenizer)
        seen.update(trainer=trainer, base=base, after={k: trainer.model.state_dict()[k].numpy() for k in base})
        return summary

    monkeypatch.setattr(run_dpo, "finish_trainer_run", finish)
    out = str(tiny.root / f"lora_{loss_type}")
    run_dpo.main(config_argv(tiny, loss_type, out, use_lora=True, lora_rank=8, learning_rate=3e-2, max_steps=8))
    assert seen["trainer"].ref_model is None and type(seen["trainer"].model).__name__ == "LoRAModel"
    assert all(np.array_equal(seen["base"][k], seen["after"][k]) for k in seen["base"])
    train = [r for r in read_metrics(out) if "loss/total" in r]
    assert all(math.isfinite(r["rewards/margins"]) for r in train)
    assert any(abs(r["rewards/chosen"]) > 1e-4 for r in train), train
