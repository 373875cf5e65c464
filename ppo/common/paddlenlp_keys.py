"""PaddleNLP argument keys that have another name here, or no equivalent here.

The one table of how PaddleNLP's `llm/alignment` and `llm/run_finetune.py` argument
files (JSON or YAML) are read by our entry points. Keys that are fields of our
dataclasses are read as they are; the rest fall in one of these groups:

- `RENAMED`: the same setting under our name (`rl_algorithm` -> `adv_estimator`),
  with its values translated where they differ. A renamed key applies only where
  its target is a field of the entry point (`max_seq_len` -> `max_length`).
- `FIXED_VALUE`: a PaddleNLP switch at the value the trainers here always run with
  (mostly PaddleNLP's default); the key is accepted with that value and refused with
  any other, saying what it would do.
- `UNSUPPORTED`: PaddleNLP features with no implementation here; refused with one
  line on what the key does in PaddleNLP.

README's "Coming from PaddleNLP" section is checked against this table.
"""
import os

RL_ALGORITHMS = {"ppo": "gae", "grpo": "grpo", "reinforce_plus_plus": "reinforce_pp", "rloo": "rloo"}
"""PaddleNLP `rl_algorithm` value -> our `adv_estimator` (PPO is GAE with a critic)."""

PADDLENLP_DPO_DATASET = "paddlenlp-dpo"
"""Registered name of PaddleNLP's DPO data format (`src`, `tgt`, `response`, `sort`)."""


def _rl_algorithm(value, _data):
    if value not in RL_ALGORITHMS:
        raise ValueError(f"rl_algorithm must be one of {sorted(RL_ALGORITHMS)}, got {value!r}")
    return RL_ALGORITHMS[value]


def _dpo_dataset(value, _data):
    return [f"{PADDLENLP_DPO_DATASET}:1:{value}"]


def _sft_train(value, _data):
    return [f"Jsonfile:1:{os.path.join(value, 'train.json')}"]


def _same(value, _data):
    return value


# PaddleNLP key -> (our key, value translation, what it is)
RENAMED = {
    "rl_algorithm": ("adv_estimator", _rl_algorithm, "ppo -> gae (with critic), grpo, reinforce_plus_plus -> reinforce_pp, rloo"),
    "num_return_sequences": ("rollout_n", _same, "samples per prompt"),
    "critic_model_name_or_path": ("reward_critic_model_name_or_path", _same, "critic initialisation"),
    "max_seq_len": ("max_length", _same, "longest prompt+answer in tokens"),
    "train_dataset_path": ("train_datasets", _dpo_dataset, f"a PaddleNLP DPO jsonl file, read as {PADDLENLP_DPO_DATASET}:1:PATH"),
    "dev_dataset_path": ("eval_datasets", _dpo_dataset, f"a PaddleNLP DPO jsonl file, read as {PADDLENLP_DPO_DATASET}:1:PATH"),
    "dataset_name_or_path": (
        "train_datasets", _sft_train, "a directory with train.json (and dev.json) of src/tgt lines, read as Jsonfile"
    ),
    "src_length": ("max_prompt_len", _same, "longest prompt in tokens; longer prompts keep their last tokens"),
    "lora": ("use_lora", _same, "train a LoRA adapter"),
}


VALUE_ALIASES = {"loss_type": {"or": "orpo"}}
"""PaddleNLP values of our own keys that have another name here (DPO `loss_type: or`)."""


def extra_mapped_keys(paddlenlp_key, value, valid):
    """Further keys a renamed key sets: `dataset_name_or_path` also gives `eval_datasets`
    when the directory has a dev.json."""
    if paddlenlp_key == "dataset_name_or_path" and "eval_datasets" in valid:
        dev = os.path.join(value, "dev.json")
        if os.path.isfile(dev):
            return {"eval_datasets": [f"Jsonfile:1:{dev}"]}
    return {}


# PaddleNLP key -> (the value we run with, what another value would do in PaddleNLP)
FIXED_VALUE = {
    "zero_padding": (False, "packs several samples into one sequence without padding"),
    "lazy": (False, "reads the dataset lazily (streaming) instead of loading it"),
    "benchmark": (False, "DPO benchmark mode: logs throughput and skips evaluation"),
    "autotuner_benchmark": (False, "stops after a few steps to time a parallel configuration"),
    "virtual_pp_degree": (1, "interleaves virtual pipeline stages"),
    "rollout_quant_type": ("", "quantises the rollout engine's weights (e.g. weight_only_int8)"),
    "global_gen_batch_size": (-1, "a separate generation batch for DAPO dynamic sampling"),
    "global_mini_batch_size": (-1, "splits each rollout batch into several optimiser mini-batches"),
    "use_fp32_compute": (True, "false computes log-probs, advantages and losses in the bf16/fp16 training dtype"),
}
"""A `None` value: any value is accepted because the key only acts together with a
switch that `FIXED_VALUE` keeps off."""


# PaddleNLP key -> what it does in PaddleNLP
UNSUPPORTED = {
    "balance_batch": "reorders rollout samples so every data-parallel rank gets a similar token count",
    "use_remove_padding": "runs the policy on unpadded (varlen) sequences",
    "rollout_max_num_seqs": "caps the sequences the inference engine decodes concurrently",
    "global_batch_size": "prompts per step over all ranks (here: per_device_prompt_batch_size per rank)",
    "per_device_logprob_batch_size": "micro-batch of the log-prob forward passes",
    "per_device_reward_batch_size": "micro-batch of the reward model's forward passes",
    "per_device_value_batch_size": "micro-batch of the critic's forward passes",
}


def fixed_value_matches(key, value):
    """Whether `value` (from a file or the command line) is the value `FIXED_VALUE` runs with."""
    expected = FIXED_VALUE[key][0]
    if expected is None:
        return True
    if isinstance(value, str) and not isinstance(expected, str):
        text = value.strip().lower()
        if isinstance(expected, bool):
            return text in (("false", "0", "no") if not expected else ("true", "1", "yes"))
        try:
            return float(text) == float(expected)
        except ValueError:
            return False
    if isinstance(expected, bool):
        return bool(value) == expected and not isinstance(value, str)
    return value == expected
