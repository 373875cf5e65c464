"""Before a resume loads anything: does the checkpoint belong to this run?

A checkpoint of another model (another hidden size, layer count, head count or vocabulary), of
another LoRA rank, or of another algorithm (another advantage estimator, with or without a
critic) would load partly ("Skip loading" for every mismatched weight) or not at all and train
on from wherever that leaves. The facts that decide the parameter shapes are compared first and
a difference is refused naming it. Checkpoints are compared through the `config.json` and
`lora_config.json` that `save_pretrained` writes beside the weights, and through the `run` facts
a PPO checkpoint's `trainer_state.json` records.
"""
import json
import os

# the config fields that decide parameter shapes (PaddleNLP Llama/Qwen names; head_dim: Qwen3's own field;
# use_bias: ERNIE 4.5's projection biases; the MoE fields of Qwen3-MoE, Qwen2-MoE and ERNIE 4.5 MoE)
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "use_bias",
              "num_experts", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",  # MoE: which weights exist
              "moe_num_experts", "moe_num_shared_experts", "moe_layer_start_index", "moe_layer_end_index",
              "moe_layer_interval", "shared_expert_intermediate_size", "qkv_bias")
LORA_KEYS = ("r", "target_modules")


class CheckpointMismatchError(ValueError):
    """The checkpoint to resume from was saved by a run that differs in a shape-deciding fact."""


def _read_json(path):
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _lora_config(model):
    """The LoRA config of `model` (a dict) or None when it has no adapters."""
    config = getattr(model, "lora_config", None)
    if config is None:
        return None
    return config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))


def _base_config(model):
    """The model config (a dict) under LoRA, DataParallel or sharding wrappers; None if none."""
    seen = 0
    while model is not None and seen < 5:
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            return config.to_dict()
        if isinstance(config, dict):
            return config
        model = getattr(model, "_layers", None) or getattr(model, "model", None)
        seen += 1
    return None


def model_facts(model):
    """Shape-deciding facts of a live `model`: {"config": {key: value}, "lora": {key: value} or None}."""
    from ..models.basics import unwrap_parallel

    inner = unwrap_parallel(model)
    config = _base_config(inner) or {}
    lora = _lora_config(inner)
    return {"config": {k: config[k] for k in SHAPE_KEYS if k in config},
            "lora": {k: _normalise(lora.get(k)) for k in LORA_KEYS} if lora else None}


def saved_model_facts(model_dir):
    """The same facts as `model_facts`, from a saved model directory."""
    config = _read_json(os.path.join(model_dir, "config.json")) or {}
    lora = _read_json(os.path.join(model_dir, "lora_config.json"))
    return {"config": {k: config[k] for k in SHAPE_KEYS if k in config},
            "lora": {k: _normalise(lora.get(k)) for k in LORA_KEYS} if lora else None}


def _normalise(value):
    return sorted(value) if isinstance(value, (list, tuple)) else value


def fact_differences(saved, current, label):
    """Messages `label: <key> is <saved> in the checkpoint but <current> in this run` for every
    shape-deciding fact that differs (a fact missing on one side is not compared)."""
    found = []
    for key in SHAPE_KEYS:
        if key in saved["config"] and key in current["config"] and saved["config"][key] != current["config"][key]:
            found.append(f"{label}: {key} is {saved['config'][key]} in the checkpoint but {current['config'][key]} in this run")
    if (saved["lora"] is None) != (current["lora"] is None):
        kind = lambda facts: "LoRA adapters" if facts["lora"] else "full weights"  # noqa: E731
        found.append(f"{label}: the checkpoint holds {kind(saved)} but this run trains {kind(current)} (use_lora)")
    elif saved["lora"]:
        for key in LORA_KEYS:
            if saved["lora"][key] != current["lora"][key]:
                found.append(f"{label}: LoRA {key} is {saved['lora'][key]} in the checkpoint but {current['lora'][key]} in this run")
    return found


def refuse_differences(path, differences):
    """Raise CheckpointMismatchError listing `differences` (nothing when there are none)."""
    if differences:
        raise CheckpointMismatchError(
            f"cannot resume from {path}: it was saved by a different run: " + "; ".join(differences)
            + ". Resume with the arguments it was saved with, or start afresh in another output_dir "
            "(or with overwrite_output_dir true, which deletes its checkpoints)."
        )


def check_model_checkpoint(path, model, label="model"):
    """Refuse resuming `model` from the saved model directory `path` when their shapes differ."""
    refuse_differences(path, fact_differences(saved_model_facts(path), model_facts(model), label))


def ppo_run_facts(args):
    """The algorithm facts a PPO checkpoint records (`trainer_state.json` "run")."""
    facts = {"adv_estimator": args.adv_estimator, "use_critic": bool(args.use_critic)}
    return {**facts, "env_name": args.env_name} if args.env_name else facts  # multi-turn runs record their environment


def check_ppo_checkpoint(path, models, run_facts, saved_state):
    """Refuse resuming from the PPO checkpoint `path` (its `trainer_state.json` read as
    `saved_state`) when a model in `models` ({"policy": actor, "value": critic or None}) has other
    shapes than the one saved, a critic is saved but not used or used but not saved, or the
    recorded `run` facts (estimator, critic) differ from `run_facts`."""
    differences = []
    saved_run = saved_state.get("run") or {}
    for key, value in run_facts.items():
        if key in saved_run and saved_run[key] != value:
            differences.append(f"{key} is {saved_run[key]} in the checkpoint but {value} in this run")
    for name, model in models.items():
        saved_dir = os.path.join(path, name)
        if model is None and os.path.isdir(saved_dir) and "use_critic" not in saved_run:
            differences.append(f"the checkpoint has a {name}/ model (a critic) but this run uses none")
        elif model is not None and not os.path.isdir(saved_dir):
            differences.append(f"the checkpoint has no {name}/ model but this run trains one")
        elif model is not None:
            differences += fact_differences(saved_model_facts(saved_dir), model_facts(model), f"{name}/")
    refuse_differences(path, differences)
