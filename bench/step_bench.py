"""Seconds per RL training step through this toolkit's trainer: a GRPO step and a PPO step on
the tiny Llama shape, with the phase breakdown; JSON on stdout. (The same steps through TRL,
for a ratio in the same run, are not part of this script yet.)

    python bench/step_bench.py                   # both cases, 5 measured steps after 1 warm-up
    python bench/step_bench.py --case grpo --steps 3

Shape (the issue's): Llama with hidden 256, intermediate 688, 4 layers, 4 heads, built by
`ppo.tiny.factory` with its character tokenizer (vocabulary about 100). Data: the demo task's
prompts (`ppo.tiny.demo_data`).

- GRPO: 4 prompts x 4 samples, exactly 16 new tokens (`min_dec_len` = `max_dec_len` = 16),
  rule reward in process (`reverse` scorer), k3 KL loss against the reference
  (`kl_loss_coeff` 0.01, `kl_coeff` 0), one optimiser step (`update_iters` 1, one batch of 16).
- PPO: 16 prompts, 16 new tokens, 4 PPO epochs (`update_iters` 4) over one batch of 16, a
  reward model and a critic (score models on the same shape), KL in the reward (`kl_coeff` 0.05).

Each measured step is `PPOTrainer.train_step()` (rollout + scoring, log-probs/values/advantages,
update); the report has the median of `--steps` steps after `--warmup` steps, and the medians
of the trainer's own phase timers (`timing_s/rollout`, `timing_s/logprob`, `timing_s/update`).
`--compare_train_patch` also runs each case with `use_train_patch false` (PaddleNLP's own
RMSNorm and RoPE) and reports `ratio_train_patch_speedup` (baseline / patched step median).
Timings are wall-clock on a shared machine: run nothing else meanwhile.
"""
import os

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")  # before paddle

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

warnings.filterwarnings("ignore")

SHAPE = dict(hidden_size=256, intermediate_size=688, num_layers=4, num_heads=4)
NEW_TOKENS = 16
CASES = {
    "grpo": dict(prompts=4, samples=4, epochs=1, critic=False),
    "ppo": dict(prompts=16, samples=1, epochs=4, critic=True),
}


def build_assets(root):
    """The tiny-shaped model (+ a score model for PPO's reward and critic) and the demo data."""
    import paddle

    from ppo.models.loading import load_tokenizer
    from ppo.models.score_model import AutoModelForScore
    from ppo.tiny.demo_data import main as make_data
    from ppo.tiny.factory import build_tiny

    model_dir, rm_dir, data_dir = (os.path.join(root, n) for n in ("model", "rm", "data"))
    build_tiny(model_dir, seed=1, **SHAPE)
    paddle.seed(2)
    AutoModelForScore.from_pretrained(model_dir).save_pretrained(rm_dir)
    load_tokenizer(model_dir).save_pretrained(rm_dir)
    with contextlib.redirect_stdout(sys.stderr):  # its summary line would break the JSON on stdout
        make_data(["--output_dir", data_dir])
    return model_dir, rm_dir, data_dir


def case_argv(case, model_dir, rm_dir, data_dir, out, train_patch=True):
    """Command-line arguments of `ppo/run_ppo.py` for one case."""
    spec = CASES[case]
    common = [
        "--actor_model_name_or_path", model_dir,
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--report_to", "none",
        "--max_steps", "1000", "--save_steps", "0", "--evaluation_strategy", "no", "--disable_tqdm", "true",
        "--per_device_prompt_batch_size", str(spec["prompts"]), "--rollout_n", str(spec["samples"]),
        "--per_device_train_batch_size", str(spec["prompts"] * spec["samples"]), "--gradient_accumulation_steps", "1",
        "--update_iters", str(spec["epochs"]), "--max_dec_len", str(NEW_TOKENS), "--min_dec_len", str(NEW_TOKENS),
        "--num_sample_generations", "0", "--use_train_patch", str(train_patch).lower(),
    ]
    if case == "grpo":
        return ["config/tiny/grpo_rule_argument.json", *common, "--rule_reward_scorers", "reverse",
                "--kl_coeff", "0", "--kl_loss_coeff", "0.01", "--kl_loss_type", "k3"]
    return ["config/tiny/ppo_argument.json", *common, "--reward_model_name_or_path", rm_dir,
            "--reward_critic_model_name_or_path", rm_dir, "--kl_coeff", "0.05"]


def ours(case, model_dir, rm_dir, data_dir, steps, warmup, train_patch=True):
    """Median step and phase seconds of this toolkit's trainer."""
    from ppo.run_ppo import build_trainer

    out = tempfile.mkdtemp(prefix=f"step_bench_{case}_")
    trainer = build_trainer(case_argv(case, model_dir, rm_dir, data_dir, out, train_patch))
    rows = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        metrics, _ = trainer.train_step()
        trainer.step += 1
        wall = time.perf_counter() - start
        if i >= warmup:
            rows.append(dict(step=wall, **{k.split("/")[1]: metrics[k] for k in
                                           ("timing_s/rollout", "timing_s/logprob", "timing_s/update")}))
    median = {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}
    return {"median_step_s": median.pop("step"), "median_phase_s": median, "steps": steps, "warmup": warmup}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=["grpo", "ppo", "all"], default="all")
    parser.add_argument("--steps", type=int, default=5, help="measured steps (median)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    parser.add_argument("--compare_train_patch", action="store_true",
                        help="also run each case with use_train_patch false (baseline) and report the ratio")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    with tempfile.TemporaryDirectory(prefix="step_bench_") as root:
        model_dir, rm_dir, data_dir = build_assets(root)
        report = {"shape": SHAPE, "new_tokens": NEW_TOKENS, "results": {}}
        for case in (["grpo", "ppo"] if args.case == "all" else [args.case]):
            result = {"case": CASES[case], "ours": ours(case, model_dir, rm_dir, data_dir, args.steps, args.warmup)}
            if args.compare_train_patch:
                base = ours(case, model_dir, rm_dir, data_dir, args.steps, args.warmup, train_patch=False)
                result["ours_without_train_patch"] = base
                result["ratio_train_patch_speedup"] = round(base["median_step_s"] / result["ours"]["median_step_s"], 3)
            report["results"][case] = result
            print(json.dumps({case: result}), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
