"""Shared by the rule-reward and recipe tests: test scorers (registered on import) and the
argument list of a one-step tiny GRPO run scored in process (`config/tiny/grpo_rule_argument.json`)."""
import json

from ppo.scorers import register_scorer


@register_scorer("test_rule_len")
def _len_scorer(src, tgt, response):
    return float(len(response))


@register_scorer("test_rule_fails_on_x")
def _fails_on_x(src, tgt, response):
    if "x" in response:
        raise RuntimeError("cannot score an x")
    return 1.0


@register_scorer("test_rule_nan")
def _nan_scorer(src, tgt, response):
    return float("nan")


def rule_argv(model_dir, data_dir, out, *extra):
    return [
        "config/tiny/grpo_rule_argument.json",
        "--actor_model_name_or_path", model_dir,
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", "1", "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
        "--per_device_train_batch_size", "8", "--max_dec_len", "6", "--evaluation_strategy", "no", "--save_steps", "0",
        "--num_sample_generations", "1", "--disable_tqdm", "true",
        *extra,
    ]


def read_metrics(out):
    return [json.loads(ln) for ln in open(f"{out}/metrics.jsonl") if "objective/scores" in ln]
