"""Shared by the rule-reward and recipe tests: test scorers (registered on import) and the
argument list of a one-step tiny GRPO run scored in process (`config/tiny/grpo_rule_argument.json`)."""
import json

from ppo.scorers import register_scorer


@register_scorer("test_rule_len")
def _len_scorer(src, tgt, response):
    return float(len(response))


@register_scorer("test_rule_char_recall")
def _char_recall_scorer(src, tgt, response):
    """Partial credit on the reversal task: the share of the label's distinct characters that occur
    in the response. A graded reward, so that the answers of a random tiny model differ within a
    group (the exact-match `reverse` scores them all 0 and leaves every advantage at 0); a missing
    label is an error, so a run scored by it has read its labels."""
    label = set(str(tgt or "").strip())
    if not label:
        raise ValueError(f"test_rule_char_recall needs a label, got {tgt!r}")
    return len(label & set(response)) / len(label)


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
