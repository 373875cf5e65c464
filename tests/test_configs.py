"""Every JSON file under config/ parses with its entry point's dataclasses: no unknown
keys and every value of the right type. Tiny (CPU) configs are also instantiated."""
import glob
import json
import os

import pytest

from ppo.common.argument_parsing import REPO_ROOT
from ppo.common.argument_parsing import read_json_arguments, valid_field_names


def is_preference_loss_config(name):
    """`<loss_type>_argument.json` for a registered preference loss (run by dpo/run_dpo.py)."""
    from ppo.algos import PREFERENCE_LOSSES

    return name.rsplit("_argument", 1)[0] in PREFERENCE_LOSSES


def entry_dataclasses(name):
    name = name.removeprefix("lora_")  # config/tiny/lora_<stage>_argument.json: the LoRA walkthrough
    if name.startswith("cost_audit"):
        from rm.audit_arguments import CostAuditArgument

        return (CostAuditArgument,)
    if name.startswith("audit"):
        from rm.audit_arguments import AuditArgument

        return (AuditArgument,)
    if name.startswith("distill"):
        from sft.distill_arguments import DataArgument, DistillTrainingArguments as T, ModelArgument
    elif name.startswith("sft"):
        from sft.sft_arguments import DataArgument, ModelArgument, SFTTrainingArguments as T
    elif name.startswith(("rm", "cost")):  # cost: rm/run_reward.py with score_type cost
        from rm.reward_arguments import DataArgument, ModelArgument, RewardTrainingArguments as T
    elif name.startswith("online_dpo"):
        from dpo.online_dpo_arguments import DataArgument, ModelArgument, OnlineDPOTrainingArguments as T
    elif name.startswith(("ppo", "safe_ppo", "grpo", "rloo", "reinforce", "vapo")):
        from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments as T
    elif name.startswith(("dpo", "simpo", "orpo", "kto", "ipo", "hinge")) or is_preference_loss_config(name):
        from dpo.dpo_arguments import DataArgument, DPOTrainingArguments as T, ModelArgument
    else:
        raise AssertionError(f"no entry point known for config {name}")
    return ModelArgument, DataArgument, T


CONFIGS = sorted(glob.glob(os.path.join(REPO_ROOT, "config", "*", "*.json")))


def test_there_are_configs_for_every_stage():
    names = {os.path.relpath(p, REPO_ROOT) for p in CONFIGS}
    for stage in ("sft", "rm", "ppo", "grpo"):
        for family in ("tiny", "llama", "qwen"):
            assert f"config/{family}/{stage}_argument.json" in names


def test_cost_model_configs_train_cost_models_on_safety_data():
    """config/{tiny,llama,qwen}/cost_argument.json: score_type cost on safety-labelled datasets."""
    from rm.reward_arguments import dataset_names, safety_labels_of

    for family in ("tiny", "llama", "qwen"):
        data = json.load(open(os.path.join(REPO_ROOT, "config", family, "cost_argument.json")))
        assert data["score_type"] == "cost", family
        for key in ("train_datasets", "eval_datasets"):
            names = dataset_names([data[key]] if isinstance(data[key], str) else data[key])
            assert names and all(safety_labels_of(n) == "required" for n in names), (family, key, names)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_config_keys_and_types(path):
    from paddlenlp.trainer import PdArgumentParser

    classes = entry_dataclasses(os.path.basename(path))
    argv = read_json_arguments(path, valid_field_names(classes))  # raises on unknown keys
    namespace, remaining = PdArgumentParser(classes).parse_known_args(argv)
    assert not remaining, remaining
    data = json.load(open(path))
    for key, value in data.items():
        parsed = getattr(namespace, key)
        if isinstance(value, bool) or isinstance(value, (int, float)) and not isinstance(value, bool):
            assert parsed == value or float(parsed) == float(value), (key, value, parsed)


@pytest.mark.parametrize("path", [p for p in CONFIGS if "/tiny/" in p], ids=os.path.basename)
def test_tiny_configs_instantiate(path, tmp_path):
    from ppo.common.argument_parsing import parse_arguments

    classes = entry_dataclasses(os.path.basename(path))
    parsed = parse_arguments(classes, [path, "--output_dir", str(tmp_path)])
    assert [type(p) for p in parsed] == list(classes)
