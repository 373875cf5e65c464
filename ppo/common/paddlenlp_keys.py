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
- `PPO_ONLY`: PaddleNLP's RL batch and packing knobs, fields of `run_ppo.py` only; another
  entry point (online DPO included) refuses them saying so, not as unknown keys.

docs/paddlenlp.md is checked against this table.
"""
import os

RL_ALGORITHMS = {"ppo": "gae", "grpo": "grpo", "reinforce_plus_plus": "reinforce_pp", "rloo": "rloo", "vapo": "vapo"}
"""PaddleNLP `rl_algorithm` value -> our `adv_estimator` (PPO is GAE with a critic; VAPO is GAE
with a critic, decoupled and length-adaptive lambdas: `ppo.algos.vapo`)."""

PADDLENLP_DPO_DATASET = "paddlenlp-dpo"
"""Registered name of PaddleNLP's DPO data format (`src`, `tgt`, `response`, `sort`)."""
PADDLENLP_PRM_DATASET = "paddlenlp-prm"
"""Registered name of the step-labelled format PaddleNLP's process reward model reads (Math-Shepherd's `input`, `label`)."""


def _rl_algorithm(value, _data):
    if value not in RL_ALGORITHMS:
        raise ValueError(f"rl_algorithm must be one of {sorted(RL_ALGORITHMS)}, got {value!r}")
    return RL_ALGORITHMS[value]


def _dpo_dataset(value, data):
    """PaddleNLP's DPO/RM data file, or its process-reward data when the same source sets `process_reward`."""
    prm = str(data.get("process_reward", False)).strip().lower() in ("true", "1", "yes")
    return [f"{PADDLENLP_PRM_DATASET if prm else PADDLENLP_DPO_DATASET}:1:{value}"]


def _sft_train(value, _data):
    return [f"Jsonfile:1:{os.path.join(value, 'train.json')}"]


def _same(value, _data):
    return value


def _loss_type(value, _data):
    return VALUE_ALIASES["loss_type"].get(value, value) if isinstance(value, str) else value


def _rollout_rows(value, data):
    """PaddleNLP's older `per_device_rollout_batch_size` (prompts per generation call and rank) as
    rows the rollout engine decodes at once: times the samples per prompt."""
    if not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
        raise ValueError(f"expected a positive integer or -1, got {value!r}")
    samples = data.get("rollout_n", data.get("num_return_sequences", 1))
    return value if value == -1 else value * int(samples)


def _task_file(value, _data):
    from .task_files import task_file_specs

    return task_file_specs(value) if value else None


TASK_FILE = "a JSON list of {filepath, prob} sources (PaddleNLP's task_ppo.json), mixed by weight (docs/data.md)"


# PaddleNLP key -> (our key, value translation, what it is)
RENAMED = {
    "rl_algorithm": ("adv_estimator", _rl_algorithm, "ppo -> gae (with critic), grpo, reinforce_plus_plus -> reinforce_pp, rloo"),
    "num_return_sequences": ("rollout_n", _same, "samples per prompt"),
    "critic_model_name_or_path": ("reward_critic_model_name_or_path", _same, "critic initialisation"),
    "max_seq_len": ("max_length", _same, "longest prompt+answer in tokens"),
    "train_dataset_path": ("train_datasets", _dpo_dataset, f"a PaddleNLP DPO jsonl file, read as {PADDLENLP_DPO_DATASET}:1:PATH "
                           f"({PADDLENLP_PRM_DATASET}:1:PATH with process_reward)"),
    "dev_dataset_path": ("eval_datasets", _dpo_dataset, f"a PaddleNLP DPO jsonl file, read as {PADDLENLP_DPO_DATASET}:1:PATH "
                         f"({PADDLENLP_PRM_DATASET}:1:PATH with process_reward)"),
    "dataset_name_or_path": (
        "train_datasets", _sft_train, "a directory with train.json (and dev.json) of src/tgt lines, read as Jsonfile"
    ),
    "src_length": ("truncate_prompt_len", _same, "longest prompt in tokens; longer prompts keep their last tokens"),
    "max_prompt_len": (
        "truncate_prompt_len", _same, "DPO: longest prompt in tokens; longer prompts keep their last tokens (PPO/GRPO's "
        "own max_prompt_len drops them)",
    ),
    "lora": ("use_lora", _same, "train a LoRA adapter"),
    "train_task_config": ("train_datasets", _task_file, TASK_FILE),
    "eval_task_config": ("eval_datasets", _task_file, TASK_FILE),
    "ptx_task_config": ("ptx_datasets", _task_file, TASK_FILE),
    # older names of PaddleNLP's own keys
    "mini_batch_size": ("global_mini_batch_size", _same, "prompts per optimiser step over all ranks (older name)"),
    "per_device_rollout_batch_size": (
        "rollout_max_num_seqs", _rollout_rows, "prompts per generation call and rank (older name): x rollout_n rows decoded at once"
    ),
    "label_key": ("response_key", _same, "field of the reference answer in the prompt data (older name)"),
    "dpo_beta": ("beta", _same, "DPO's beta (older name)"),
    "dpo_loss_type": ("loss_type", _loss_type, "DPO's loss type (older name)"),
    "dpo_label_smoothing": ("label_smoothing", _same, "DPO's label smoothing (older name)"),
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


PPO_ONLY = (
    "global_batch_size", "global_mini_batch_size", "global_gen_batch_size", "per_device_logprob_batch_size",
    "per_device_reward_batch_size", "per_device_value_batch_size", "rollout_max_num_seqs", "balance_batch",
    "use_remove_padding",
)
"""PaddleNLP RL keys that are `PPOTrainingArguments` fields (ppo/run_ppo.py) and no other entry point's."""


# PaddleNLP key -> (the value we run with, what another value would do in PaddleNLP)
FIXED_VALUE = {
    "zero_padding": (False, "packs several samples into one sequence without padding (here: SFT, the reward model, dpo/run_dpo.py and dpo/run_kto.py; PPO/GRPO: use_remove_padding; online DPO runs padded)"),
    "lazy": (False, "streams the data (an IterableDataset read while training, no shuffling) instead of reading and "
                    "tokenising every record at start-up (here: sft/run_sft.py, rm/run_reward.py, dpo/run_dpo.py and "
                    "dpo/run_kto.py stream it; this entry point reads it whole)"),
    "benchmark": (False, "benchmark mode: trains only (no evaluation, no checkpoints, no final model) to time a "
                         "configuration (here: sft/run_sft.py, rm/run_reward.py, dpo/run_dpo.py and dpo/run_kto.py)"),
    "autotuner_benchmark": (False, "stops after a few steps to time a parallel configuration"),
    "virtual_pp_degree": (1, "interleaves virtual pipeline stages"),
    "rollout_quant_type": ("", "quantises the rollout engine's weights (e.g. weight_only_int8)"),
    "quant_type": ("", "older name of rollout_quant_type: quantises the rollout engine's weights (e.g. weight_only_int8)"),
    "use_fp32_compute": (True, "false computes log-probs, advantages and losses in the bf16/fp16 training dtype"),
}
"""A `None` value: any value is accepted because the key only acts together with a
switch that `FIXED_VALUE` keeps off."""


# PaddleNLP key -> what it does in PaddleNLP
UNSUPPORTED = {
}

# PaddleNLP key -> why every value trains the same here
SAME_RESULT = {
    "greedy_zero_padding": "PaddleNLP: how zero_padding fills its packed rows, greedily (true) or in file order; here "
                           "each batch's samples are packed first-fit decreasing (the greedy choice) and the losses and "
                           "gradients are the padded batch's either way",
}
"""Keys accepted at any value: the trainers here give the same losses and gradients for each
(the value decides only how a PaddleNLP run lays out its work)."""


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


# ---------------------------------------------------------------- PaddleNLP's TrainingArguments in the PPO loop
# SFT, RM and the DPO family run PaddleNLP's own Trainer, which acts on every TrainingArguments
# field. PPO / GRPO (ppo/run_ppo.py) runs the loop in ppo/entry/ppo_trainer.py instead: a field it does
# not read is in exactly one of the three tables below (tests/test_ppo_training_arguments.py
# walks the dataclass and checks that).

# field -> (the values the PPO loop runs with, what another value does in PaddleNLP); `()`: only
# PaddleNLP's default null. Checked in the argument file and on the command line (one error with
# every other problem) and again after parsing (`ppo_value_problems`).
PPO_FIXED_VALUE = {
    "report_to": (("visualdl", "wandb", "tensorboard", "none", "all"), "autonlp reports trials to Ray Tune (PaddleNLP's AutoNLP)"),
    "save_strategy": (("steps", "no"), "epoch saves a checkpoint at the end of every epoch"),
    "evaluation_strategy": (("steps", "no"), "epoch evaluates at the end of every epoch"),
    "logging_strategy": (("steps",), "no / epoch log never / once per epoch"),
    "do_predict": ((False,), "runs prediction on a test set after training"),
    "do_export": ((False,), "exports a static-graph inference model after training"),
    "num_cycles": ((0.5,), "number of cosine waves of the cosine schedule"),
    "save_on_each_node": ((False,), "saves on every node's local disk"),
    "bf16_full_eval": ((False,), "evaluates with the model cast to bfloat16"),
    "fp16_full_eval": ((False,), "evaluates with the model cast to float16"),
    "save_sharded_model": ((False,), "saves each sharding rank's slice of the model"),
    "load_sharded_model": ((False,), "loads a model saved as sharding slices"),
    "sep_parallel_degree": ((-1, 1), "splits the sequence over ranks (segment parallelism)"),
    "context_parallel_degree": ((-1, 1), "splits the sequence over ranks (context parallelism)"),
    "expert_tensor_parallel_degree": ((-1, 1), "tensor parallelism inside mixture-of-experts experts"),
    "refined_recompute": (("",), "recomputes only the listed operators (e.g. flash_attn:-1)"),
    "max_evaluate_steps": ((-1,), "stops each evaluation after this many batches"),
    "ignore_data_skip": ((False,), "a resumed run starts at the first batch instead of where the checkpoint stopped"),
    "flatten_param_grads": ((False,), "fuses all gradients into one buffer (NPU)"),
    "use_async_save": ((False,), "writes checkpoints from a background process"),
    "metrics_output_path": ((), "writes the final metrics to this JSON file (here: output_dir/summary.json)"),
    "unified_checkpoint": ((False,), "saves checkpoints in the unified, parallelism-independent safetensors layout"),
    "to_static": ((False,), "runs the models as static graphs"),
    "ckpt_quant_stage": (("O0",), "quantises the optimizer states saved in checkpoints"),
    "ignore_load_lr_and_optim": ((False,), "a resumed run starts with a fresh optimizer and schedule"),
    "enable_auto_parallel": ((False,), "PaddlePaddle's auto-parallel (static) training"),
    "skip_data_intervals": ((), "skips the data of the given step ranges"),
    "pdc_download_ckpt": ((False,), "downloads the checkpoint to resume from Baidu's PDC storage"),
    "count_trained_tokens": ((False,), "logs the number of trained tokens"),
    "optim": (("adamw",), "adafactor / adamw_mini / adamw_custom / adamw_16bit_moment use another optimizer"),
}


def _setting_differs(name, default):
    return lambda args: getattr(args, name) not in (default, None)


# field -> (when it is logged once at start-up (args -> bool), why it does not act in the PPO loop)
PPO_INERT = {
    "amp_custom_black_list": (
        lambda a: bool(a.amp_custom_black_list),
        "PaddleNLP autocasts with these lists; the PPO loop loads the models in the bf16/fp16 dtype without autocast and "
        "computes log-probs, KL and losses in float32 (the log-probs in the training dtype with use_fp32_compute false)",
    ),
    "amp_custom_white_list": (
        lambda a: bool(a.amp_custom_white_list),
        "PaddleNLP autocasts with these lists; the PPO loop loads the models in the bf16/fp16 dtype without autocast, so "
        "matmuls and embeddings already run in that dtype",
    ),
    "pipeline_parallel_config": (
        lambda a: bool(a.pipeline_parallel_config) and a.pipeline_parallel_degree <= 1,
        "PaddleNLP reads it only at pipeline_parallel_degree > 1",
    ),
    "wandb_http_proxy": (lambda a: bool(a.wandb_http_proxy), "the PPO loop's wandb writer reads it from the environment: set WANDB_HTTPS_PROXY"),
    "wandb_api_key": (lambda a: bool(a.wandb_api_key), "the PPO loop's wandb writer reads it from the environment: set WANDB_API_KEY (or wandb login)"),
    "sequence_parallel": (
        lambda a: bool(a.sequence_parallel),
        "PaddleNLP turns it off below tensor_parallel_degree 2; at 2 and above model loading refuses it (not implemented here)",
    ),
    "split_inputs_sequence_dim": (None, "acts with sep_parallel_degree > 1 only, which the PPO loop refuses"),
    "lr_end": (
        lambda a: str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)) == "polynomial",
        "polynomial schedule only; the PPO loop's floor is min_learning_rate",
    ),
    "power": (
        lambda a: str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)) == "polynomial",
        "polynomial schedule only",
    ),
    "prediction_loss_only": (_setting_differs("prediction_loss_only", False), "Trainer.evaluate only; PPO evaluates by generation"),
    "eval_accumulation_steps": (_setting_differs("eval_accumulation_steps", None), "Trainer.evaluate only; PPO evaluates by generation"),
    "past_index": (_setting_differs("past_index", -1), "Trainer only (models that return memories)"),
    "remove_unused_columns": (_setting_differs("remove_unused_columns", True), "Trainer's dataset columns only; the PPO datasets are built here"),
    "label_names": (_setting_differs("label_names", None), "Trainer only; the PPO losses need no labels"),
    "minimum_eval_times": (_setting_differs("minimum_eval_times", None), "Trainer's evaluation schedule only (here: eval_steps)"),
    "log_on_each_node": (_setting_differs("log_on_each_node", True), "the PPO loop logs on global rank 0 only"),
    "dataloader_num_workers": (_setting_differs("dataloader_num_workers", 0), "prompts are drawn in the training process (PromptSampler)"),
    "ddp_find_unused_parameters": (_setting_differs("ddp_find_unused_parameters", None), "every actor/critic parameter gets a gradient each step"),
    "skip_memory_metrics": (_setting_differs("skip_memory_metrics", True), "the PPO loop logs no memory metrics"),
    "lazy_data_processing": (_setting_differs("lazy_data_processing", True), "Trainer's datasets only"),
    "ordered_save_group_size": (_setting_differs("ordered_save_group_size", 0), "Trainer's checkpoint writer only"),
    "distributed_dataloader": (_setting_differs("distributed_dataloader", False), "every rank draws its own prompts (PromptSampler)"),
    "unified_checkpoint_config": (None, "acts with unified_checkpoint only, which the PPO loop refuses"),
    "force_reshard_pp": (None, "pipeline checkpoints only"),
    "auto_parallel_resume_form_hybrid_parallel": (None, "auto-parallel only, which the PPO loop refuses"),
    "expert_max_capacity": (None, "mixture-of-experts only"),
    "expert_min_capacity": (None, "mixture-of-experts only"),
    "save_sharding_stage1_model_include_freeze_params": (None, "Trainer's sharded model saving only"),
    "pdc_download_timeout": (None, "acts with pdc_download_ckpt only, which the PPO loop refuses"),
    "scale_loss": (
        lambda a: bool(a.fp16),
        "PaddleNLP's initial fp16 loss scale; the PPO loop has no loss scaler (bf16 needs none)",
    ),
    "skip_profile_timer": (
        None,
        "the PPO loop always logs its phase timers timing_s/{rollout,logprob,update,step} (host clocks, no device sync)",
    ),
    "do_train": (None, "run_ppo.py always trains"),
    "pad_token_id": (None, "batches are padded with the tokenizer's pad token"),
}

# field -> what PaddleNLP's TrainingArguments does with it while the arguments are parsed (it
# sets up the device and the fleet hybrid-parallel strategy the PPO loop's wrappers use)
PPO_BY_PADDLENLP = {
    "no_cuda": "part of PaddleNLP's device selection",
    "device": "the device PaddleNLP's TrainingArguments sets",
    "local_rank": "set by paddle.distributed.launch",
    "output_signal_dir": "PaddleNLP's default is output_dir; written by its cluster tooling",
    "sharding": "the sharding stage of the fleet strategy (sharding_parallel_degree > 1)",
    "sharding_degree": "old name of sharding_parallel_degree",
    "sharding_parallel_degree": "fleet strategy: sharding ranks",
    "sharding_parallel_mesh_dimension": "fleet strategy: mesh axis of sharding",
    "sharding_comm_buffer_size_MB": "fleet strategy: sharding communication buffer",
    "sharding_parallel_config": "fleet strategy options; enable_release_grads also frees gradients in the PPO loop",
    "data_parallel_config": "fleet strategy options of data parallelism",
    "tensor_parallel_config": "fleet strategy options of tensor parallelism",
    "sequence_parallel_config": "fleet strategy options of sequence parallelism",
    "fuse_sequence_parallel_allreduce": "fleet strategy option of sequence parallelism",
    "hybrid_parallel_topo_order": "fleet strategy: order of the parallel axes",
}


def _normalised(value):
    value = getattr(value, "value", value)  # IntervalStrategy and other enums
    return value.strip().lower() if isinstance(value, str) else value


def value_accepted(accepted, value):
    """Whether `value` (parsed, or a string / list / number from a file or the command line) is
    one of `accepted`; None (PaddleNLP's null default) always is, and a list when all its items are."""
    if value is None:
        return True
    if isinstance(value, dict):  # PaddleNLP parses some strings into dicts: "" -> {}
        return not value and "" in accepted
    if isinstance(value, (list, tuple)):
        return all(value_accepted(accepted, v) for v in value)
    value = _normalised(value)
    for expected in accepted:
        if isinstance(expected, bool):
            text = str(value).lower()
            if (value is expected) or (not isinstance(value, (str, bool)) and value == expected) or \
                    text in ((("true", "1", "yes") if expected else ("false", "0", "no"))):
                return True
        elif isinstance(expected, str):
            if isinstance(value, str) and value == expected.lower():
                return True
        elif not isinstance(value, bool):
            try:
                if float(value) == float(expected):
                    return True
            except (TypeError, ValueError):
                pass
    return False


def ppo_fixed_value_problem(key, value, where):
    """None when the PPO loop runs `key` at `value`, else the message saying why not."""
    accepted, does = PPO_FIXED_VALUE[key]
    if value_accepted(accepted, value):
        return None
    allowed = " or ".join(repr(a) for a in accepted) if accepted else "null (PaddleNLP's default)"
    value = getattr(value, "value", value)  # IntervalStrategy.EPOCH -> epoch
    return f"{where}: '{key}: {value}' is not supported here (PaddleNLP: {does}); the PPO/GRPO loop runs with {allowed} only"


def ppo_value_problems(args):
    """Messages for every `PPO_FIXED_VALUE` field of the parsed `args` at a value the loop does not run."""
    found = (ppo_fixed_value_problem(k, getattr(args, k), "PPO arguments") for k in PPO_FIXED_VALUE if hasattr(args, k))
    return [p for p in found if p]


def inert_setting_messages(args):
    """One line per `PPO_INERT` field that is set in `args`: what it is and why it does not act here."""
    return [
        f"{name}={getattr(args, name)!r} does nothing in the PPO/GRPO loop: {why}"
        for name, (when, why) in PPO_INERT.items()
        if when is not None and hasattr(args, name) and when(args)
    ]


def batch_knob_messages(model_args, args):
    """One line per PaddleNLP batch knob of the PPO arguments that is set where it cannot act."""
    out = []
    if args.balance_batch and args.dataset_world_size == 1:
        out.append("balance_batch does nothing with one data-parallel rank: it holds every rollout row")
    if args.per_device_reward_batch_size > 0 and model_args.external_scores:
        out.append("per_device_reward_batch_size does nothing here: scores come from a reward server or rule scorers, "
                   "not a reward-model forward")
    return out
