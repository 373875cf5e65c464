"""What a run prints for a person watching it: one line per logging step, the evaluation table
when an evaluation runs, and a closing summary that says where everything was written.

The numbers are those of `metrics.jsonl` under the same names (TRL prints its logged dict every
`logging_steps`, PaddleNLP's Trainer a `name: value, ...` line); this module only chooses and
formats them. The machine-readable traces stay `metrics.jsonl` and `summary.json`.
"""
import os

from .paddlenlp_keys import RL_ALGORITHMS

STEP_LINE_METRICS = (
    "objective/scores", "objective/rlhf_reward", "objective/kl", "objective/cost", "loss/policy_avg", "loss/value_avg",
    "loss/kl", "loss/ptx", "policy/entropy_avg", "policy/clipfrac_avg", "lagrange/lambda", "lr",
    "response_length/mean", "timing_s/step",
)
"""The metrics of a PPO/GRPO step line, in this order (those a run does not log are left out)."""

SUMMARY_PREFIXES = ("eval/", "loss/", "rm/", "cost/")
SUMMARY_METRICS = ("objective/scores", "objective/kl", "rewards/accuracies", "rewards/margins", "response_length/mean")
"""The final metrics the closing summary repeats: these and those named `SUMMARY_PREFIXES`..."""
SUMMARY_SKIPPED = ("runtime", "per_second", "num_samples", "progress_or_epoch")
"""... except the Trainer's bookkeeping (evaluation time and throughput)."""


def number(value):
    """A metric as a short readable number: 4 significant digits, exponent form below 1e-3."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4g}"


def run_label(adv_estimator, lagrangian=False):
    """The algorithm's name a user knows (PaddleNLP's `rl_algorithm`: ppo for GAE, grpo, rloo,
    reinforce_plus_plus; the estimator's own name otherwise), `-lagrangian` with a cost model."""
    names = {estimator: algorithm for algorithm, estimator in RL_ALGORITHMS.items()}
    label = names.get(adv_estimator, adv_estimator)
    return f"{label}-lagrangian" if lagrangian else label


def step_line(step, total, metrics, names=STEP_LINE_METRICS):
    """`step 3/130 | objective/scores 0.625 | objective/kl 2.10e-04 | ... | lr 1.50e-04`."""
    parts = [f"step {step}/{total}"] + [f"{name} {number(metrics[name])}" for name in names if name in metrics]
    return " | ".join(parts)


def evaluation_table(step, metrics):
    """`evaluation at step N:` and one aligned `name  value` line per metric."""
    if not metrics:
        return f"evaluation at step {step}: no metrics"
    width = max(len(name) for name in metrics)
    rows = [f"  {name:<{width}}  {number(value)}" for name, value in sorted(metrics.items())]
    return "\n".join([f"evaluation at step {step}:"] + rows)


def output_paths(output_dir, logging_dir=None, report_to=("visualdl",), models=()):
    """`(what, path)` of a run's outputs that exist: its models (`models`: `(what, sub-directory)`,
    "" for output_dir itself), the newest checkpoint, metrics.jsonl, samples.jsonl, summary.json,
    resolved_arguments.json and the VisualDL logs."""
    found = [(what, os.path.join(output_dir, sub) if sub else output_dir) for what, sub in models]
    checkpoints = sorted((int(name.rsplit("-", 1)[1]), name) for name in _listdir(output_dir)
                         if name.startswith("checkpoint-") and name.rsplit("-", 1)[1].isdigit())
    if checkpoints:
        found.append(("last checkpoint", os.path.join(output_dir, checkpoints[-1][1])))
    for what, name in (("metrics", "metrics.jsonl"), ("samples", "samples.jsonl"), ("summary", "summary.json"),
                       ("arguments", "resolved_arguments.json")):
        found.append((what, os.path.join(output_dir, name)))
    if "visualdl" in (report_to or ()):
        found.append(("VisualDL logs", logging_dir or os.path.join(output_dir, "visualdl")))
    return [(what, path) for what, path in found if os.path.exists(path)]


def _listdir(path):
    return os.listdir(path) if os.path.isdir(path) else []


def closing_summary(title, summary, paths):
    """The last lines of a run: `title` (with steps and wall time from `summary.json`'s dict), the
    final evaluation and training metrics, the best evaluated policy when one was restored, and
    every path of `paths` (`output_paths`), the VisualDL command included."""
    final = summary.get("final", {})
    steps = summary.get("steps", summary.get("global_step"))
    head = title + (f": {steps} steps" if steps is not None else "") + f" in {summary.get('wall_time_s', 0):.0f} s"
    lines = [head]
    shown = dict(final, **{k: v for k, v in (summary.get("final_eval") or {}).items() if isinstance(v, (int, float))})
    shown = {k: v for k, v in sorted(shown.items()) if (k.startswith(SUMMARY_PREFIXES) or k in SUMMARY_METRICS)
             and not any(skip in k for skip in SUMMARY_SKIPPED)}
    if shown:
        lines.append("  final:  " + " | ".join(f"{k} {number(v)}" for k, v in shown.items()))
    best = summary.get("best_policy")
    if isinstance(best, dict) and best.get("step") is not None:
        lines.append(f"  best:   step {best['step']} ({best.get('metric')} {number(best.get('value'))}), restored for the "
                     "final save")
    if summary.get("diverged"):
        lines.append("  diverged: " + "; ".join(summary["diverged"]))
    paths = list(paths) + [("watch", f"visualdl --logdir {path}") for what, path in paths if what == "VisualDL logs"]
    width = max([len(what) for what, _ in paths] + [0])
    lines += [f"  {what + ':':<{width + 1}} {path}" for what, path in paths]
    return "\n".join(lines)
