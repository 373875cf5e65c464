"""One-step-off-policy rollout (async_staleness 1) against the synchronous split run (staleness 0).

    python scripts/quickstart.py --stop-after sft            # the demo's SFT model and data (outputs/tiny)
    flock /tmp/bench.lock python bench/async_bench.py        # JSON on stdout
    flock /tmp/bench.lock python bench/async_bench.py --seeds 42 --max_steps 40   # a shorter look

Both arms are the tiny GRPO demo (`config/tiny/grpo_argument.json`, scored in process by the
`reverse` rule scorer instead of the reward server) on two processes of one
`paddle.distributed.launch` with `rollout_placement split` (rank 0 trains, rank 1 generates),
one thread each. Answers of skewed lengths: the GRPO prompts are the demo's (answers of 3-7
characters) with a tail of `long_frac` (10%) prompts whose answers are `long_min`..`long_max`
(28-44) characters long, `max_dec_len` long enough for them, so a batch's generation lasts as
long as its longest answer. The quickstart's SFT model never saw answers that long (it stops after about
8 tokens), so it is first taught them: `sft_steps` (400) more SFT steps from it (sft/run_sft.py,
`config/tiny/sft_argument.json`) on 15,000 of the demo's SFT pairs and 5,000 long ones (done once,
kept in `--out`; not timed). Staleness 0 generates batch k with the weights after step k and
trains on it (generation and training take turns); staleness 1 generates
batch k + 1 with the weights of step k while step k trains, corrected by the rollout importance
weights (`rollout_is`). Steps/s: steps over the summed `timing_s/step` of the run (the loop's
steps, without start-up, logging and evaluation); ratio = staleness 1 / staleness 0 per seed.
Held-out accuracy: greedy exact match on the demo's `test.jsonl` (300 strings the training
never saw) at the last step. Runs are interleaved per seed (staleness 0, then 1).
`overlap_bound` of a staleness-0 run is step time / (step time - its wait for the batch): the ratio if generation hid entirely behind
training; the measured ratio reaches it only when each process has a core of its own.
`use_remove_padding` is on in both arms (training passes cost the real tokens, not rows x the
longest row), which is where a long tail of answers costs generation more than training."""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def skewed_rows(source, out_path, n_short, n_long, long_min, long_max, seed=0):
    """The first `n_short` records of `source` plus `n_long` reversal records with answers of
    `long_min`..`long_max` characters, shuffled into `out_path`; returns the record count."""
    from ppo.tiny.reverse_task import ALPHABET, correct_answer, reverse_prompt

    rows = [json.loads(line) for line in open(source)][:n_short]
    rng = random.Random(seed)
    for _ in range(n_long):
        s = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(long_min, long_max)))
        rows.append({"src": [reverse_prompt(s)], "tgt": [correct_answer(s)]})
    rng.shuffle(rows)
    with open(out_path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return len(rows)


def long_answer_sft(args):
    """The quickstart's SFT model taught long answers (once; see the module docstring): its path."""
    out = os.path.join(args.out, "sft_long")
    if os.path.exists(os.path.join(out, "model_state.pdparams")):
        return out
    data = os.path.join(args.out, "sft_long.jsonl")
    demo = os.path.abspath(args.demo_root)
    skewed_rows(os.path.join(demo, "data", "sft.jsonl"), data, 15000, 5000, args.long_min, args.long_max, seed=1)
    cmd = [sys.executable, "sft/run_sft.py", "config/tiny/sft_argument.json", "--model_name_or_path", f"{demo}/sft",
           "--train_datasets", f"Jsonfile:1.0:{data}", "--eval_datasets", f"Jsonfile:1.0:{demo}/data/valid.jsonl",
           "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_length", str(2 * args.long_max + 24),
           "--max_steps", str(args.sft_steps),
           "--learning_rate", "0.001", "--warmup_steps", "10", "--eval_steps", str(args.sft_steps), "--save_steps",
           str(args.sft_steps), "--disable_tqdm", "true", "--overwrite_output_dir", "true"]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the long-answer SFT failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return out


def run_arm(args, model, prompts, seed, staleness, out, layout=(1, 1)):
    """One split run of `layout` (trainer ranks, rollout ranks); returns its steps/s, held-out
    accuracy and async metrics (trainer rank 0's)."""
    demo = os.path.abspath(args.demo_root)
    trainers, replicas = layout
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(trainers + replicas),
           "--log_dir", f"{out}/launch",
           "ppo/run_ppo.py", "config/tiny/grpo_argument.json", "--actor_model_name_or_path", model,
           "--use_rm_server", "false", "--use_rule_reward", "true", "--rule_reward_scorers", "reverse",
           "--train_datasets", f"Jsonfile:1.0:{prompts}", "--eval_datasets", f"Jsonfile:1.0:{demo}/data/test.jsonl",
           "--output_dir", out, "--logging_dir", f"{out}/vdl", "--overwrite_output_dir", "true", "--seed", str(seed),
           "--max_steps", str(args.max_steps), "--eval_steps", str(args.max_steps), "--save_steps", "0",
           "--load_best_model_at_end", "false", "--max_prompt_len", str(args.long_max + 16),
           "--max_length", str(args.long_max + 16 + args.max_dec_len),
           "--max_dec_len", str(args.max_dec_len), "--disable_tqdm", "true", "--num_sample_generations", "0",
           "--rollout_placement", "split", "--rollout_ranks", str(replicas), "--async_staleness", str(staleness), "--rollout_is", "token",
           "--use_rollout_logprobs", "false", "--use_remove_padding", str(args.remove_padding).lower()]
    env = dict(os.environ, PYTHONPATH=REPO, MKL_DEBUG_CPU_TYPE="5", OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"staleness {staleness} seed {seed} failed:\n{proc.stdout[-3000:]}")
    rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
    steps = [r for r in rows if "objective/scores" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    mean = lambda key: statistics.fmean(r[key] for r in steps)  # noqa: E731
    step_s = sum(r["timing_s/step"] for r in steps) / len(steps)
    return {"steps": len(steps), "steps_per_s": 1 / step_s,
            # the speed-up if the generation this run waited for were hidden entirely behind training
            "overlap_bound": step_s / (step_s - mean("async/rollout_wait_s")),
            "accuracy": evals[-1]["eval/accuracy"], "accuracy_step": evals[-1]["step"], "launch_wall_s": time.time() - t0,
            "staleness_mean": mean("async/staleness_mean"), "rollout_wait_s": mean("async/rollout_wait_s"),
            "train_wait_s": mean("async/train_wait_s"), "weights_sync_s": mean("async/weights_sync_s"),
            "is_weight_mean": mean("rollout/is_weight_mean") if "rollout/is_weight_mean" in steps[0] else None,
            "response_length_max": max(r["response_length/max"] for r in steps)}


def layout_summary(runs, layout, seeds):
    """Staleness 1 against staleness 0 of one layout ("N+M") over `seeds`."""
    arm = lambda s, key: [runs[f"{layout}_s{s}_seed{seed}"][key] for seed in seeds]  # noqa: E731
    ratio = [a / s for a, s in zip(arm(1, "steps_per_s"), arm(0, "steps_per_s"))]
    return {"sync_steps_per_s": arm(0, "steps_per_s"), "async_steps_per_s": arm(1, "steps_per_s"),
            "ratio": ratio, "ratio_median": statistics.median(ratio), "sync_overlap_bound": arm(0, "overlap_bound"),
            "sync_accuracy": arm(0, "accuracy"), "async_accuracy": arm(1, "accuracy"),
            "accuracy_gap_points": 100 * (statistics.fmean(arm(1, "accuracy")) - statistics.fmean(arm(0, "accuracy")))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo_root", default="outputs/tiny", help="quickstart output root (its sft/ and data/)")
    parser.add_argument("--seeds", default="42,43,44")
    parser.add_argument("--max_steps", type=int, default=130, help="the demo's GRPO steps")
    parser.add_argument("--long_frac", type=float, default=0.1, help="share of the GRPO prompts with long answers")
    parser.add_argument("--long_min", type=int, default=28)
    parser.add_argument("--long_max", type=int, default=44,
                        help="at most 52: prompt and answer within the tiny model's 128 positions")
    parser.add_argument("--max_dec_len", type=int, default=48)
    parser.add_argument("--sft_steps", type=int, default=400, help="SFT steps teaching the long answers")
    parser.add_argument("--remove_padding", type=int, default=1,
                        help="use_remove_padding: training passes cost the real tokens, not batch x longest row")
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--layouts", default="1+1",
                        help="comma-separated N+M: N trainer ranks beside M rollout ranks (rollout_ranks), each run at "
                             "staleness 0 and 1 (scripts/throughput_model.py --validate reads the JSON)")
    parser.add_argument("--out", default="/tmp/async_bench")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    prompts = os.path.join(args.out, "prompts_skewed.jsonl")
    n_short = sum(1 for _ in open(os.path.join(args.demo_root, "data", "prompts.jsonl")))
    n_long = int(round(n_short * args.long_frac / (1 - args.long_frac)))
    total = skewed_rows(os.path.join(args.demo_root, "data", "prompts.jsonl"), prompts, n_short, n_long, args.long_min,
                        args.long_max)
    model = long_answer_sft(args)
    runs, load_before = {}, os.getloadavg()
    seeds, layouts = list(map(int, args.seeds.split(","))), args.layouts.split(",")
    for layout in layouts:
        for seed in seeds:
            for staleness in (0, 1):
                name = f"{layout}_s{staleness}_seed{seed}"
                runs[name] = run_arm(args, model, prompts, seed, staleness, f"{args.out}/{name}",
                                     layout=tuple(map(int, layout.split("+"))))
                print(json.dumps({name: runs[name]}), file=sys.stderr, flush=True)
    result = {
        "setup": {"prompts": total, "long_answer_prompts": n_long, "long_len": [args.long_min, args.long_max],
                  "max_dec_len": args.max_dec_len, "sft_steps": args.sft_steps, "max_steps": args.max_steps, "seeds": seeds,
                  "layouts": layouts, "threads_per_process": args.threads, "use_remove_padding": bool(args.remove_padding),
                  "cpu_count": os.cpu_count(), "loadavg_1_5_15_before": load_before, "loadavg_1_5_15_after": os.getloadavg()},
        "layouts": {layout: layout_summary(runs, layout, seeds) for layout in layouts},
        "runs": runs,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
