"""Seconds per GRPO step and per PPO step on the tiny Llama shape (or the tiny Qwen3 or
Qwen3-MoE of that width, `--arch`), in this toolkit's trainer and (when PyTorch + TRL are
installed, see requirements-bench.txt) in TRL on the same shape.

    python bench/step_bench.py                                  # ours and TRL (if found)
    python bench/step_bench.py --trl_python /work/benchvenv/bin/python
    python bench/step_bench.py --case grpo --steps 2 --no_trl   # quick
    python bench/step_bench.py --arch qwen3_moe                 # a family of ppo/tiny/factory.py

Model: `LlamaForCausalLM` from `ppo.tiny.factory.build_tiny` with hidden 256, intermediate
688, 4 layers, 4 heads (vocabulary of the tiny tokenizer), random weights; the reward model
is `AutoModelForScore` over the same weights. TRL builds a transformers `LlamaForCausalLM`
with the same config (its own random weights: same shapes and lengths, not the same numbers).
`--arch qwen3` / `qwen3_moe`: `build_tiny`'s Qwen3 of that width (q/k norms, 2 KV heads, head
dim 128, tied embeddings) or Qwen3-MoE (4 experts, top-2, of width 344 on every layer but the
first; the router's load-balancing loss off on both sides, as transformers 5.23's
`load_balancing_loss_func` fails on a padded batch when some layers are dense); TRL builds
transformers' `Qwen3ForCausalLM` / `Qwen3MoeForCausalLM` from the same config.json.

Steps (each side runs `--steps` (10) of them after one warm-up step; medians are reported; the
two sides' steps alternate, TRL's worker waiting while ours runs, so that a load change on a
shared host weighs on both alike; `ratio_trl_over_ours_paired` is the median of the ratios of
adjacent steps, steadier under a bursty load; `load_avg_1m` records the load average as each
case starts and ends):
- GRPO: 4 prompts x 4 samples, 16 new tokens (EOS suppressed, so every response is 16
  tokens), k3 KL loss (coefficient 0.04) with a reference pass, one optimiser step over the
  16 sequences. Scores from the reward model.
- PPO: 16 prompts, 16 new tokens, 4 PPO epochs over one mini-batch of 16, critic + reward
  model, k1 KL penalty in the reward (0.05).
Ours runs the trainer's real `train_step` (built by `ppo.run_ppo.build_trainer`) and reports
its phases: rollout (generation + scoring), logprob (old/reference log-probs, values,
advantages) and update. TRL runs in the interpreter given by `--trl_python` (a separate
environment, so PyTorch never meets Paddle in one process); its step time is the median
wall time from one `on_step_end` callback to the next, less the wait while our step runs
(GRPO: TRL generates inside the step, so the step includes the rollout as ours does; PPO:
TRL's PPOTrainer runs its whole loop body per `update`, timed the same way). JSON on stdout; `ratio_trl_over_ours` < 1
means TRL is faster. Both sides run with the same number of OpenMP threads (Paddle's
OMP_NUM_THREADS, which its import sets to 1 when unset; `--trl_threads` to change TRL's).
`--compare_train_patch` also runs our side with `use_train_patch false` (PaddleNLP's own
RMSNorm and RoPE) and reports `ratio_train_patch_speedup` (unpatched / patched median).
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

warnings.filterwarnings("ignore")

SHAPE = dict(hidden_size=256, intermediate_size=688, num_layers=4, num_heads=4, max_position_embeddings=128)
NEW_TOKENS = 16
GRPO = dict(prompts=4, samples=4, kl_loss_coeff=0.04, epochs=1)
PPO = dict(prompts=16, samples=1, kl_coeff=0.05, epochs=4)
DEFAULT_TRL_PYTHONS = {"grpo": ["/work/benchvenv/bin/python"], "ppo": ["/work/benchvenv112/bin/python", "/work/benchvenv/bin/python"]}
TRL_PROBES = {  # what each case needs from TRL (its PPOTrainer left TRL after 1.12)
    "grpo": "from trl import GRPOTrainer",
    "ppo": "try:\n from trl import PPOTrainer\nexcept ImportError:\n from trl.experimental.ppo import PPOTrainer",
}


ARCHS = ("llama", "qwen3", "qwen3_moe")
"""The families both sides build (ours from `ppo.tiny.factory`, TRL's from transformers)."""


def _set_config(model_dir, **fields):
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump(dict(config, **fields), f, indent=2)


def build_assets(root, shape=SHAPE, num_prompts=64, arch="llama"):
    """Tiny model + tokenizer of `arch`, a reward model over the same weights, and prompt data."""
    import paddle

    from ppo.models.loading import load_tokenizer
    from ppo.models.score_model import AutoModelForScore
    from ppo.tiny import demo_data
    from ppo.tiny.factory import build_tiny

    model_dir, rm_dir, data_dir = (os.path.join(root, n) for n in ("model", "rm", "data"))
    build_tiny(model_dir, seed=7, arch=arch, **shape)
    if arch == "qwen3_moe":  # router losses off on both sides (transformers 5.23's fails with a padding mask)
        _set_config(model_dir, output_router_logits=False)
    paddle.seed(5)
    AutoModelForScore.from_pretrained(model_dir).save_pretrained(rm_dir)
    load_tokenizer(model_dir).save_pretrained(rm_dir)
    demo_data.generate(data_dir, seed=3, num_sft=16, num_preference=8, num_preference_eval=8, num_prompts=num_prompts, num_test=8)
    return model_dir, rm_dir, data_dir


def our_argv(case, model_dir, rm_dir, data_dir, out, new_tokens=NEW_TOKENS, steps=6, train_patch=True):
    """`run_ppo` arguments of one bench case (see the module docstring)."""
    common = [
        "--actor_model_name_or_path", model_dir, "--reward_model_name_or_path", rm_dir, "--use_rm_server", "false",
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", str(steps),
        "--max_dec_len", str(new_tokens), "--min_dec_len", str(new_tokens), "--gradient_accumulation_steps", "1",
        "--eval_steps", "0", "--save_steps", "0", "--num_sample_generations", "0", "--disable_tqdm", "true",
        "--report_to", "none", "--seed", "42", "--use_train_patch", str(train_patch).lower(),
    ]
    if case == "grpo":
        cfg = GRPO
        rows = cfg["prompts"] * cfg["samples"]
        return ["config/tiny/grpo_argument.json", "--load_best_model_at_end", "false", *common, "--per_device_prompt_batch_size", str(cfg["prompts"]),
                "--rollout_n", str(cfg["samples"]), "--per_device_train_batch_size", str(rows),
                "--per_device_eval_batch_size", str(rows), "--update_iters", str(cfg["epochs"]),
                "--kl_coeff", "0.0", "--kl_loss_coeff", str(cfg["kl_loss_coeff"]), "--kl_loss_type", "k3"]
    cfg = PPO
    return ["config/tiny/ppo_argument.json", "--load_best_model_at_end", "false", *common, "--per_device_prompt_batch_size", str(cfg["prompts"]),
            "--rollout_n", "1", "--per_device_train_batch_size", str(cfg["prompts"]),
            "--per_device_eval_batch_size", str(cfg["prompts"]), "--update_iters", str(cfg["epochs"]),
            "--kl_coeff", str(cfg["kl_coeff"])]


class OurSteps:
    """This toolkit's side of one case, as a context manager: entering builds the trainer (`ppo.run_ppo.build_trainer`)
    and runs one warm-up step; `run(n)` measures `n` more `train_step`s (callable several times, so
    that TRL's run can sit between two halves of ours); `result()` gives the medians of all of them."""

    def __init__(self, case, model_dir, rm_dir, data_dir, steps, new_tokens=NEW_TOKENS, train_patch=True):
        self.argv_args = (case, model_dir, rm_dir, data_dir)
        self.steps, self.new_tokens, self.train_patch = steps, new_tokens, train_patch
        self.runs, self.out, self.trainer = [], None, None

    def __enter__(self):
        import paddle

        from ppo.run_ppo import build_trainer

        self.out = tempfile.mkdtemp(prefix=f"step_bench_{self.argv_args[0]}_")
        self.trainer = build_trainer(our_argv(*self.argv_args, self.out, self.new_tokens, self.steps + 1, self.train_patch))
        paddle.seed(0)
        self.trainer.train_step()  # warm-up: allocates gradients and AdamW moments
        self.trainer.state.step += 1
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.out, ignore_errors=True)

    def run(self, n):
        for _ in range(n):
            start = time.perf_counter()
            metrics, exp = self.trainer.train_step()
            wall = time.perf_counter() - start
            self.trainer.state.step += 1
            self.runs.append({"step": wall, "rollout": metrics["timing_s/rollout"], "logprob": metrics["timing_s/logprob"],
                              "update": metrics["timing_s/update"], "tokens": float(exp.response_mask.sum()), "rows": len(exp),
                              "loss": metrics.get("loss/policy_avg", float("nan"))})

    def result(self):
        runs = self.runs
        med = {k: round(statistics.median(r[k] for r in runs), 4) for k in ("step", "rollout", "logprob", "update")}
        return {
            "step_s_median": med["step"],
            "phases_s_median": {k: med[k] for k in ("rollout", "logprob", "update")},
            "step_s_all": [round(r["step"], 4) for r in runs],
            "sequences_per_step": runs[-1]["rows"],
            "response_tokens_per_step": runs[-1]["tokens"],
            "loss_policy_last": runs[-1]["loss"],
        }


def run_ours(case, model_dir, rm_dir, data_dir, steps, new_tokens=NEW_TOKENS, train_patch=True):
    """One warm-up step then `steps` measured `train_step`s; medians of step and phases."""
    with OurSteps(case, model_dir, rm_dir, data_dir, steps, new_tokens, train_patch) as side:
        side.run(steps)
        return side.result()


def paddle_threads():
    """OMP threads Paddle runs with: importing paddle sets OMP_NUM_THREADS to 1 when unset."""
    import paddle  # noqa: F401

    return int(os.environ.get("OMP_NUM_THREADS", "1"))


def find_trl_python(case, explicit):
    """`(interpreter, "trl X torch Y transformers Z")` able to run `case` in TRL, or `(None, why)`."""
    candidates = [explicit] if explicit else DEFAULT_TRL_PYTHONS[case] + [sys.executable]
    notes = []
    for py in candidates:
        if not py or not os.path.exists(py):
            notes.append(f"{py}: not found")
            continue
        code = (f"import torch, transformers, trl\n{TRL_PROBES[case]}\n"
                "print('trl', trl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)")
        probe = subprocess.run([py, "-c", code], capture_output=True, text=True)
        if probe.returncode == 0:
            return py, f"{py}: {probe.stdout.strip()}"
        notes.append(f"{py}: {probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else 'probe failed'}")
    return None, "; ".join(notes)


def run_trl(py, case, model_dir, data_dir, steps, new_tokens=NEW_TOKENS, threads=None, between=None):
    """The TRL worker (bench/trl_step_worker.py) in `py`; its JSON result or a failure record.
    `between(i)`, when given, runs after TRL's step `i` (0: its warm-up) for `i < steps`, while the
    worker waits (`--interleave`): the two sides' steps alternate and see the same load."""
    cmd = [py, os.path.join(ROOT, "bench", "trl_step_worker.py"), "--case", case, "--model_dir", model_dir,
           "--prompts", os.path.join(data_dir, "prompts.jsonl"), "--interleave",
           "--steps", str(steps), "--new_tokens", str(new_tokens), "--config", json.dumps(GRPO if case == "grpo" else PPO)]
    threads = threads or paddle_threads()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    lines, done = [], 0
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        for line in proc.stdout:
            if line.strip() != "@@step":  # the worker's STEP_SIGNAL
                lines.append(line)
                continue
            if between is not None and done < steps:
                between(done)
            done += 1
            proc.stdin.write("go\n")
            proc.stdin.flush()
        proc.wait()
        err.seek(0)
        if proc.returncode != 0:
            return {"failed": f"exit status {proc.returncode}", "stderr_tail": err.read()[-2000:]}
    return json.loads(lines[-1])


def run_case(case, assets, args, new_tokens, trl_py):
    """One case's results: ours, TRL's (when `trl_py`) and their ratio, `--compare_train_patch`'s
    unpatched run. Our measured steps alternate with TRL's (`run_trl`'s `between`), so that a change
    in the machine's load during the run weighs on both sides alike; `load_avg_1m` is the host's
    load average when the case starts and ends."""
    model_dir, rm_dir, data_dir = assets
    load_start = os.getloadavg()[0]
    with OurSteps(case, model_dir, rm_dir, data_dir, args.steps, new_tokens) as side:
        if trl_py:  # one of our steps after each of TRL's (its warm-up first)
            trl_result = run_trl(trl_py, case, model_dir, data_dir, args.steps, new_tokens, args.trl_threads,
                                 between=lambda i: side.run(1))
            print(json.dumps({case: trl_result}), file=sys.stderr, flush=True)
        side.run(args.steps - len(side.runs))  # all of them without TRL (or if TRL stopped early)
        result = {"ours": side.result()}
    print(json.dumps({case: result["ours"]}), file=sys.stderr, flush=True)
    if args.compare_train_patch:
        base = run_ours(case, model_dir, rm_dir, data_dir, args.steps, new_tokens, train_patch=False)
        result["ours_without_train_patch"] = base
        result["ratio_train_patch_speedup"] = round(base["step_s_median"] / result["ours"]["step_s_median"], 3)
    if trl_py:
        result["trl"] = trl_result
        if "step_s_median" in trl_result:
            result["ratio_trl_over_ours"] = round(trl_result["step_s_median"] / result["ours"]["step_s_median"], 3)
            pairs = list(zip(trl_result.get("step_s_all", []), result["ours"]["step_s_all"]))
            if pairs:  # TRL's step i+1 ran right after our step i: each pair saw about the same load
                result["ratio_trl_over_ours_paired"] = round(statistics.median(t / o for t, o in pairs), 3)
    result["load_avg_1m"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    return result


def main(argv=None):
    from ppo.common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--case", choices=["grpo", "ppo", "all"], default="all")
    parser.add_argument("--arch", choices=ARCHS, default="llama", help="the tiny model's family (both sides)")
    parser.add_argument("--steps", type=int, default=10, help="measured steps after one warm-up step (each side)")
    parser.add_argument("--trl_python", default=None, help="interpreter with torch + transformers + trl for GRPO (default: /work/benchvenv, then this one)")
    parser.add_argument("--trl_ppo_python", default=None,
                        help="interpreter with a TRL that has PPOTrainer (<= 1.12; default: /work/benchvenv112, /work/benchvenv, this one)")
    parser.add_argument("--trl_threads", type=int, default=None,
                        help="OMP/torch threads of the TRL runs (default: as many as Paddle uses here, OMP_NUM_THREADS, 1 when unset; "
                             "more threads than free cores make PyTorch's OpenMP stall on a shared machine)")
    parser.add_argument("--no_trl", action="store_true", help="only this toolkit's numbers")
    parser.add_argument("--compare_train_patch", action="store_true",
                        help="also run our side with use_train_patch false (PaddleNLP's own RMSNorm and RoPE) and report the ratio")
    parser.add_argument("--small", action="store_true", help="a 1-layer 32-hidden model and 4 new tokens (checks of the bench itself)")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    shape = dict(SHAPE, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2) if args.small else SHAPE
    new_tokens = 4 if args.small else NEW_TOKENS
    cases = ["grpo", "ppo"] if args.case == "all" else [args.case]

    trl = {}
    for case in cases:
        explicit = args.trl_python if case == "grpo" else args.trl_ppo_python
        trl[case] = (None, "disabled with --no_trl") if args.no_trl else find_trl_python(case, explicit)
    report = {"model": dict(shape, arch=args.arch), "new_tokens": new_tokens, "measured_steps": args.steps,
              "grpo_setup": GRPO, "ppo_setup": PPO,
              "threads": {"paddle": paddle_threads(), "trl": args.trl_threads or paddle_threads()}, "trl": {c: note for c, (py, note) in trl.items() if py},
              "note": "; ".join(f"{c}: TRL not run ({note}), our numbers only" for c, (py, note) in trl.items() if not py) or None,
              "results": {}}
    with tempfile.TemporaryDirectory(prefix="step_bench_") as tmp:
        assets = build_assets(tmp, shape, arch=args.arch)
        report["model"]["architecture"] = json.load(open(os.path.join(assets[0], "config.json")))["architectures"][0]
        for case in cases:
            report["results"][case] = run_case(case, assets, args, new_tokens, trl[case][0])
    text = json.dumps(report, indent=2)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main()
