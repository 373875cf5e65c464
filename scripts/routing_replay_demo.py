"""The mixture-of-experts GRPO demo with routing replay off and on, side by side.

    python scripts/routing_replay_demo.py                      # seeds 42 and 43, 40 GRPO steps each
    python scripts/routing_replay_demo.py --seeds 42 --steps 10
    python scripts/routing_replay_demo.py --bf16_rollout  # the rollout from bfloat16-rounded weights

Builds a small Qwen3-MoE (`ppo.tiny.factory --arch qwen3_moe`: 2 layers, hidden 64, 4 experts,
top-2, the first layer dense) and the demo data, fine-tunes it briefly (`sft/run_sft.py`), then
for each seed runs `ppo/run_ppo.py` with `config/tiny/grpo_rule_argument.json` twice,
`moe_routing_replay none` and `rollout`, with the old log-probs recomputed by the training
forward (`use_rollout_logprobs false`, so every step logs the rollout/training mismatch
`rollout/logprob_diff_*`). With `--bf16_rollout` every generate call runs on the actor's weights
rounded to bfloat16 (restored after it), as an inference engine serving bfloat16 weights differs
from a float32 trainer: the setting routing replay is for. One run at a time, each in a
subprocess (the entry point's `build_trainer`, so the rollout can be wrapped). Writes
`<out>/routing_replay_summary.json` and prints a markdown table of, per run: the mismatch (mean
over steps of `rollout/logprob_diff_mean`, largest `rollout/logprob_diff_max`, the steps where
that exceeds 1e-4), the replay agreement (`moe/replay_agreement`), the scores of the first and
last five steps and the largest `policy/approxkl_avg`.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
ENV = {**os.environ, "MKL_DEBUG_CPU_TYPE": "5", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
       "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
MODEL = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, arch="qwen3_moe")


def run(cmd, log):
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=ENV, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[:2])} failed ({done.returncode}); see {log}")


def prepare(out, sft_steps):
    """The demo data, the base model and its SFT (skipped when already there); the SFT directory."""
    from ppo.tiny import demo_data
    from ppo.tiny.factory import build_tiny

    data, base, sft = (os.path.join(out, name) for name in ("data", "base", "sft"))
    if not os.path.exists(os.path.join(data, "prompts.jsonl")):
        demo_data.generate(data, seed=3, num_sft=8192, num_preference=16, num_preference_eval=16, num_prompts=1024,
                           num_test=64)
    if not os.path.exists(os.path.join(base, "config.json")):
        build_tiny(base, seed=42, **MODEL)
    if not os.path.exists(os.path.join(sft, "config.json")):
        run(["sft/run_sft.py", "config/tiny/sft_argument.json", "--model_name_or_path", base,
             "--train_datasets", f"Jsonfile:1.0:{data}/sft.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data}/valid.jsonl",
             "--output_dir", sft, "--logging_dir", f"{sft}/vdl", "--max_steps", str(sft_steps), "--warmup_steps", "10",
             "--evaluation_strategy", "no", "--do_eval", "false", "--save_steps", "0", "--disable_tqdm", "true"],
            os.path.join(out, "sft.log"))
    return data, sft


@contextlib.contextmanager
def bfloat16_weights(model):
    """`model`'s float32 weights rounded to bfloat16 inside the block, restored after it."""
    import paddle

    saved = {}
    with paddle.no_grad():
        for name, p in model.named_parameters():
            if p.dtype == paddle.float32:
                saved[name] = p.numpy().copy()
                p.set_value(p.astype("bfloat16").astype("float32"))
    try:
        yield
    finally:
        with paddle.no_grad():
            for name, p in model.named_parameters():
                if name in saved:
                    p.set_value(saved[name])


def train_child(argv, bf16_rollout):
    """The child process of one GRPO run: `ppo.run_ppo.build_trainer(argv)`, its rollout on
    bfloat16-rounded weights with `bf16_rollout`, trained."""
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(argv)
    if bf16_rollout:
        engine, actor = trainer.experience.rollout.engine, trainer.passes.models.actor
        generate = engine.generate

        def rounded(*args, **kwargs):
            with bfloat16_weights(actor):
                return generate(*args, **kwargs)

        engine.generate = rounded
    trainer.train()


def grpo(out, data, sft, seed, replay, args):
    """One GRPO run; its `metrics.jsonl` lines with a score."""
    steps, bf16_rollout = args.steps, args.bf16_rollout
    shape = "" if (args.update_iters, args.train_rows) == (1, 64) else f"it{args.update_iters}-rows{args.train_rows}-"
    name = f"grpo-{'bf16-' if bf16_rollout else ''}{shape}{replay}-seed{seed}"
    run_dir = os.path.join(out, name)
    if not os.path.exists(os.path.join(run_dir, "summary.json")):
        argv = ["config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", sft,
                "--train_datasets", f"Jsonfile:1.0:{data}/prompts.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data}/test.jsonl",
                "--output_dir", run_dir, "--logging_dir", f"{run_dir}/vdl", "--max_steps", str(steps), "--seed", str(seed),
                "--per_device_prompt_batch_size", "8", "--rollout_n", "8",
                "--per_device_train_batch_size", str(args.train_rows), "--update_iters", str(args.update_iters), "--evaluation_strategy", "no", "--save_steps", "0", "--num_sample_generations", "0",
                "--use_rollout_logprobs", "false", "--moe_routing_replay", replay, "--disable_tqdm", "true"]
        run([__file__, "--child", json.dumps(argv)] + (["--bf16_rollout"] if bf16_rollout else []),
            os.path.join(out, f"{name}.log"))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "objective/scores" in r]


def summarize(lines):
    """The numbers of one run (see the module docstring)."""
    def mean(key, part=slice(None)):
        values = [r[key] for r in lines[part] if key in r]
        return sum(values) / len(values) if values else None

    return {"steps": len(lines), "logprob_diff_mean": mean("rollout/logprob_diff_mean"),
            "logprob_diff_max_mean": mean("rollout/logprob_diff_max"),
            "logprob_diff_max": max(r["rollout/logprob_diff_max"] for r in lines),
            "steps_diff_max_over_1e-4": sum(r["rollout/logprob_diff_max"] > 1e-4 for r in lines),
            "replay_agreement": mean("moe/replay_agreement"), "scores_first5": mean("objective/scores", slice(0, 5)),
            "scores_last5": mean("objective/scores", slice(-5, None)),
            "approxkl_max": max(r.get("policy/approxkl_avg", 0.0) for r in lines),
            "clipfrac_mean": mean("policy/clipfrac_avg"), "grad_norm_max": max(r["train/actor_grad_norm"] for r in lines)}


def table(summary):
    keys = list(next(iter(summary.values())))
    rows = ["| run | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    fmt = lambda v: "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    rows += [f"| {name} | " + " | ".join(fmt(s[k]) for k in keys) + " |" for name, s in summary.items()]
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/moe-replay")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sft_steps", type=int, default=600)
    parser.add_argument("--bf16_rollout", action="store_true")
    parser.add_argument("--update_iters", type=int, default=1)
    parser.add_argument("--train_rows", type=int, default=64, help="per_device_train_batch_size (64: one optimiser step)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one run's argv (JSON), in the child process
    args = parser.parse_args(argv)
    if args.child:
        return train_child(json.loads(args.child), args.bf16_rollout)
    out = os.path.join(ROOT, args.out) if not os.path.isabs(args.out) else args.out
    os.makedirs(out, exist_ok=True)
    data, sft = prepare(out, args.sft_steps)
    summary = {f"seed {seed}, replay {replay}": summarize(grpo(out, data, sft, seed, replay, args))
               for seed in args.seeds for replay in ("none", "rollout")}
    name = (f"routing_replay_summary{'_bf16_rollout' if args.bf16_rollout else ''}"
            f"{'' if (args.update_iters, args.train_rows) == (1, 64) else f'_it{args.update_iters}_rows{args.train_rows}'}.json")
    with open(os.path.join(out, name), "w") as f:
        json.dump(summary, f, indent=2)
    print(table(summary))


if __name__ == "__main__":
    main()
