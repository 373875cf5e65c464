"""Peak memory and time of one PPO step and one GRPO step, with and without chunked LM-head
log-probs, on a Qwen2.5-0.5B-shaped model.

    python bench/memory_bench.py                         # PPO and GRPO, 8 x 1,024 tokens
    python bench/memory_bench.py --case grpo --seq_len 256 --num_layers 2

Model: PaddleNLP `Qwen2ForCausalLM` with Qwen2.5-0.5B's shapes (vocabulary 151,936, hidden
896, 14 query / 2 key-value heads, q/k/v biases, tied embeddings, intermediate 4,864) and
`--num_layers` layers (4), random weights, written once with `save_pretrained` into a temporary
directory and loaded by every case the way the trainer loads it (`load_causal_lm`,
`AutoModelForScore` for the critic). No tokenizer is needed: the rollout is replaced by fixed
random token ids, so the bench is about the step's memory, not generation.

Step (the trainer's own parts, `AdvantageStage.complete` and `PPOUpdater.learn`):
actor old log-probs and reference log-probs (KL coefficient 0.05), critic values (PPO),
rewards and advantages (GAE for PPO; GRPO with groups of 4), then one update over the
`--batch` sequences in one micro-batch (actor, and critic for PPO). Sequences are
`--prompt_len` prompt tokens (some rows left-padded) and `--seq_len - --prompt_len` response
tokens (some rows shorter).

Before the measured step a short warm-up step (8-token sequences) allocates the gradients
and AdamW moments, as every step after the first finds them (`--no_warmup` measures a first
step instead, which also allocates them). Each (case, logprob_chunk_size) runs in a fresh
subprocess; `logprob_chunk_size 0` is the
full-logits path (`[batch, seq, vocab]` float32 logits), `--chunk_size` (512) the chunked
one. Memory is the process's resident-set high-water mark (Linux `VmHWM`, reset with
`/proc/self/clear_refs` right before the step; `ru_maxrss` where that is not possible):
`step_peak_rss_mb` (whole process during the step: models, optimiser state, activations),
`rss_before_step_mb`, and `step_extra_mb` = their difference (what the step itself needs).
Ratios are full / chunked. Times are wall-clock seconds of the step and are noisy on a shared
machine. JSON on stdout.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import warnings


warnings.filterwarnings("ignore")

QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=32768,
)
GROUP_SIZE = 4


def build_model_dir(path, num_layers, vocab_size=QWEN25_05B["vocab_size"], seed=0):
    """A random-weight Qwen2.5-0.5B-shaped `Qwen2ForCausalLM` saved into `path`."""
    import paddle
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    shape = dict(QWEN25_05B, vocab_size=vocab_size)
    config = Qwen2Config(num_hidden_layers=num_layers, dtype="float32", use_flash_attention=False, **shape)
    paddle.seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    return path


def _rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak():
    """Reset the resident-set high-water mark; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def fixed_experience(batch, prompt_len, seq_len, vocab_size, seed=0):
    """A scored rollout `Experience` of random token ids (rows of one prompt share it in groups
    of `GROUP_SIZE`): some prompts left-padded, some responses shorter."""
    import numpy as np
    import paddle

    from ppo.experience import Experience, ObjectiveTrace
    from ppo.models.causal_lm import position_ids_from_mask

    rng = np.random.default_rng(seed)
    response_len = seq_len - prompt_len
    prompts = np.repeat(rng.integers(3, vocab_size, size=(batch // GROUP_SIZE, prompt_len)), GROUP_SIZE, axis=0)
    prompt_mask = np.ones((batch, prompt_len), "int64")
    for i in range(batch):
        prompt_mask[i, : (i // GROUP_SIZE) * 7] = 0  # left padding, shared by a group
    lengths = np.maximum(1, response_len - rng.integers(0, response_len // 4 + 1, size=batch))
    response_mask = (np.arange(response_len)[None, :] < lengths[:, None]).astype("float32")
    responses = rng.integers(3, vocab_size, size=(batch, response_len))
    sequences = np.concatenate([prompts * prompt_mask, responses], axis=1)
    attention_mask = paddle.to_tensor(np.concatenate([prompt_mask, response_mask.astype("int64")], axis=1))
    exp = Experience(
        prompt_len=prompt_len,
        sequences=paddle.to_tensor(sequences),
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        response_ids=paddle.to_tensor(responses),
        response_mask=paddle.to_tensor(response_mask),
        group_ids=paddle.to_tensor(np.arange(batch) // GROUP_SIZE),
        src=[""] * batch, label=[None] * batch, prompt_text=[""] * batch,
        ends_with_eos=paddle.to_tensor(lengths < response_len),
    )
    exp.objectives["reward"] = ObjectiveTrace(paddle.to_tensor(rng.normal(size=batch).astype("float32")))
    return exp.advance("scored")


def step_parts(args, models):
    """The PPO step's advantage stage and updater for `models` on one process (no rollout, no
    scoring: the bench hands in scored experiences), each from its slice of `args`."""
    from types import SimpleNamespace

    from ppo.algos import FixedKLController
    from ppo.common.divergence import DivergenceDetector
    from ppo.optimization.offload import OffloadPlan
    from ppo.entry.ppo_trainer import CRITIC_NAMES, trained_model
    from ppo.strategy import PassSettings, PlainStrategy
    from ppo.trainer.advantages import AdvantageStage
    from ppo.trainer.objectives import PlainCombiner, ScoredObjective
    from ppo.trainer.settings import AdvantageSettings, UpdateSettings, slice_of
    from ppo.trainer.updater import OptimizerSteps, PPOUpdater
    from ppo.trainer.watch import DivergenceWatch

    strategy, state, offload = PlainStrategy(), SimpleNamespace(step=0), OffloadPlan(frozenset(), {}, {})
    actor = trained_model("actor", "policy", models.actor, strategy, args, 1)
    critic = trained_model(*CRITIC_NAMES["reward"], models.critic, strategy, args, 1, critic=True)
    objectives = [ScoredObjective("reward", None, critic)]
    passes = strategy.build_passes(models, actor.model, {"reward": critic.model} if critic else {}, {}, PassSettings(
        temperature=args.temperature, logprob_chunk_size=args.logprob_chunk_size, pad_token_id=0,
        chunk_rows={which: args.pass_rows(which) for which in ("logprob", "value", "reward")}))
    stage = AdvantageStage(passes, objectives, PlainCombiner(), args.estimator, kl_control=FixedKLController(args.kl_coeff),
                           offload=offload, reference_scope=("reference",), ranks=strategy.ranks, state=state,
                           settings=slice_of(AdvantageSettings, args))
    watch = DivergenceWatch(DivergenceDetector(), strategy.ranks)
    learner = PPOUpdater(actor, objectives, passes, OptimizerSteps(strategy, state, args.max_nan_skips, False), ptx=None,
                         divergence=watch, offload=offload, state=state, ranks=strategy.ranks,
                         settings=slice_of(UpdateSettings, args), samples=None)
    return stage, learner


def run_case(model_dir, case, chunk_size, batch, prompt_len, seq_len, warmup=True, recompute=False):
    """One measured step in this process (after a short warm-up step with `warmup`; with
    `recompute`, full activation recompute in the actor and critic decoders, as the trainer's
    `recompute` / `critic_recompute`); returns the measurements."""
    import paddle

    from ppo.common.metrics import MetricAccumulator
    from ppo.models.loading import enable_recompute, freeze, load_causal_lm, set_dropout_off
    from ppo.models.ppo_models import PPOModels
    from ppo.models.score_model import AutoModelForScore
    from ppo.entry.ppo_arguments import PPOTrainingArguments
    from ppo.trainer.loop import StepClock

    paddle.seed(0)
    grpo = case == "grpo"
    args = PPOTrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="memory_bench_"),
        adv_estimator="grpo" if grpo else "gae",
        rollout_n=GROUP_SIZE if grpo else 1,
        per_device_prompt_batch_size=batch // GROUP_SIZE if grpo else batch,
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=batch,
        gradient_accumulation_steps=1,
        update_iters=1,
        kl_coeff=0.05,
        learning_rate=1e-6,
        critic_learning_rate=1e-6,
        max_steps=1,
        logprob_chunk_size=chunk_size,
        report_to=[],
    )
    actor = set_dropout_off(load_causal_lm(model_dir))
    reference = freeze(set_dropout_off(load_causal_lm(model_dir)))
    critic = None
    if not grpo:
        critic = set_dropout_off(AutoModelForScore.from_pretrained(
            model_dir, score_type="critic", do_normalize=False, normalizer_type=None))
    if recompute:
        for model in (actor, critic):
            if model is not None:
                enable_recompute(model, "full")
    models = PPOModels(actor=actor, reference=reference, reward=None, critic=critic)

    stage, learner = step_parts(args, models)

    def one_step(exp):
        actor.eval()
        stats = stage.complete(exp)
        acc = MetricAccumulator()
        learner.learn(exp, acc, StepClock())
        return stats, acc

    if warmup:  # a short step first: gradients and AdamW moments exist before the measured step
        one_step(fixed_experience(batch, 4, 8, actor.config.vocab_size, seed=1))
    exp = fixed_experience(batch, prompt_len, seq_len, actor.config.vocab_size)
    rss_before = _rss_kb("VmRSS")
    reset = _reset_peak()
    start = time.perf_counter()
    stats, acc = one_step(exp)
    seconds = time.perf_counter() - start
    peak = _rss_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = max(peak, rss_before)  # the kernel updates the high-water mark lazily; the step began at rss_before
    result = acc.local_result()
    return {
        "case": case,
        "logprob_chunk_size": chunk_size,
        "warmup_step": warmup,
        "recompute": recompute,
        "step_s": round(seconds, 2),
        "rss_before_step_mb": round(rss_before / 1024, 1),
        "step_peak_rss_mb": round(peak / 1024, 1),
        "step_extra_mb": round((peak - rss_before) / 1024, 1),
        "peak_source": "VmHWM after clear_refs" if reset else "ru_maxrss (includes loading)",
        "response_tokens": int(float(exp.response_mask.sum())),
        "loss_policy": float(result.get("loss/policy_avg", float("nan"))),
        "entropy": float(result.get("policy/entropy_avg", float("nan"))),
        "objective_kl": float(stats["objective/kl"]),
    }


def main(argv=None):
    from ppo.common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--case", choices=["ppo", "grpo", "all"], default="all")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (a multiple of 4)")
    parser.add_argument("--seq_len", type=int, default=1024, help="prompt + response tokens")
    parser.add_argument("--prompt_len", type=int, default=None, help="prompt tokens (default: half of seq_len)")
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--chunk_size", type=int, default=512, help="logprob_chunk_size of the chunked runs")
    parser.add_argument("--vocab_size", type=int, default=QWEN25_05B["vocab_size"], help="only for quick checks of the bench itself")
    parser.add_argument("--model_dir", default=None, help="reuse a model directory (default: build one in a temp dir)")
    parser.add_argument("--modes", default="full_logits,chunked",
                        help="comma-separated subset of full_logits,chunked (e.g. skip a baseline that cannot fit)")
    parser.add_argument("--recompute", action="store_true",
                        help="full activation recompute in actor and critic, in both modes (as a 1k-token run would use)")
    parser.add_argument("--no_warmup", action="store_true", help="measure the first step (AdamW moments and gradients allocated in it)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "case:chunk", internal
    args = parser.parse_args(argv)
    if args.batch % GROUP_SIZE:
        parser.error(f"--batch must be a multiple of {GROUP_SIZE} (GRPO groups)")
    prompt_len = args.prompt_len if args.prompt_len is not None else args.seq_len // 2
    if not 0 < prompt_len < args.seq_len:
        parser.error("--prompt_len must be between 1 and seq_len - 1")
    unknown = set(args.modes.split(",")) - {"full_logits", "chunked"}
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}; use full_logits and/or chunked")

    if args.worker:
        case, chunk = args.worker.split(":")
        print(json.dumps(run_case(args.model_dir, case, int(chunk), args.batch, prompt_len, args.seq_len, not args.no_warmup,
                                  args.recompute)))
        return None

    tmp = None
    model_dir = args.model_dir
    if model_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="qwen25_shape_")
        model_dir = build_model_dir(tmp.name, args.num_layers, args.vocab_size)
    cases = ["ppo", "grpo"] if args.case == "all" else [args.case]
    report = {
        "model": dict(QWEN25_05B, num_hidden_layers=args.num_layers, vocab_size=args.vocab_size),
        "batch": args.batch, "seq_len": args.seq_len, "prompt_len": prompt_len, "warmup_step": not args.no_warmup, "recompute": args.recompute, "results": {},
    }
    try:
        for case in cases:
            runs = {}
            modes = {"full_logits": 0, "chunked": args.chunk_size}
            for label, chunk in [(m, modes[m]) for m in args.modes.split(",")]:
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"{case}:{chunk}", "--model_dir", model_dir,
                       "--batch", str(args.batch), "--seq_len", str(args.seq_len), "--prompt_len", str(prompt_len)]
                cmd += ["--no_warmup"] if args.no_warmup else []
                cmd += ["--recompute"] if args.recompute else []
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:  # e.g. killed by the kernel's OOM killer (-9): recorded, not hidden
                    runs[label] = {"case": case, "logprob_chunk_size": chunk, "failed": f"exit status {proc.returncode}",
                                   "stderr_tail": proc.stderr[-1500:]}
                else:
                    runs[label] = json.loads(proc.stdout.strip().splitlines()[-1])
                print(json.dumps(runs[label]), file=sys.stderr, flush=True)
            full, chunked = runs.get("full_logits", {"failed": "not run"}), runs.get("chunked", {"failed": "not run"})
            if "failed" in full or "failed" in chunked:
                report["results"][case] = runs
                continue
            runs["ratio_step_peak_rss"] = round(full["step_peak_rss_mb"] / chunked["step_peak_rss_mb"], 2)
            runs["ratio_step_extra"] = round(full["step_extra_mb"] / max(chunked["step_extra_mb"], 1e-9), 2)
            runs["ratio_step_time"] = round(full["step_s"] / chunked["step_s"], 2)
            report["results"][case] = runs
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
