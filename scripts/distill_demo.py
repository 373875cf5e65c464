"""The distillation demo on the tiny task: a 4x larger teacher, then on-policy distillation of the
SFT student against SFT on the teacher's samples (off-policy), at the same student-token budget.

    python scripts/distill_demo.py                      # everything, into outputs/tiny (skips what exists)
    python scripts/distill_demo.py --seeds 42,43,44 --steps 150 --batch_size 32

Stages (each the real entry script as a subprocess, one thread each; done stages are skipped):
 1. build: the demo data, the student base (0.4M parameters) and a teacher base of hidden 256
    (1.6M parameters, `ppo/tiny/factory.py`), both with the same tokenizer;
 2. the student's SFT (`config/tiny/sft_argument.json`, the quickstart's); the teacher's SFT, then
    GRPO against the exact-match reward server (`config/tiny/grpo_argument.json`);
 3. teacher samples: one sampled answer (temperature 1, as the student samples on-policy) of the
    teacher to each prompt of `sft.jsonl`, written as `teacher_samples.jsonl`;
 4. per seed: on-policy distillation (`sft/run_distill.py`, `lmbda` 1: every step the student's
    own samples, scored token by token by the teacher) and off-policy (`sft/run_sft.py` on the
    teacher's samples), both from the student's SFT model, `--steps` steps of `--batch_size`;
 5. greedy exact match on the 300 held-out prompts of `test.jsonl` (`scripts/evaluate.py`) of the
    teacher, the SFT student and every run, with the answer tokens each run trained on; the table
    goes to `<root>/distill/summary.json`.
"""
import argparse
import json
import os
import sys
import time

from scripts.demo_runs import run_logged

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from scripts.quickstart import free_port, start_reward_server  # noqa: E402

PY = sys.executable
ENV = dict(os.environ, MKL_DEBUG_CPU_TYPE="5", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
TEACHER_SIZE = ["--hidden_size", "256", "--intermediate_size", "672"]


def run(log_dir, name, cmd):
    """Run `cmd` logged to `<log_dir>/<name>.log`; its wall seconds (scripts/demo_runs.py)."""
    return run_logged(log_dir, name, cmd, ENV, "distill_demo")


def data_flags(root, train="sft.jsonl"):
    return ["--train_datasets", f"Jsonfile:1.0:{root}/data/{train}", "--eval_datasets", f"Jsonfile:1.0:{root}/data/valid.jsonl"]


def out_flags(out):
    return ["--output_dir", out, "--logging_dir", f"{out}/visualdl"]


def build_and_train_teacher(root, logs):
    """Stages 1-2 (skipped where their outputs exist)."""
    dist = f"{root}/distill"
    if not os.path.isfile(f"{root}/data/test.jsonl"):
        run(logs, "data", [PY, "-m", "ppo.tiny.demo_data", "--output_dir", f"{root}/data"])
    for name, extra in (("base", []), ("distill/teacher_base", TEACHER_SIZE)):
        if not os.path.isfile(f"{root}/{name}/config.json"):
            run(logs, name.replace("/", "_"), [PY, "-m", "ppo.tiny.factory", "--output_dir", f"{root}/{name}", *extra])
    for out, base in ((f"{root}/sft", f"{root}/base"), (f"{dist}/teacher_sft", f"{dist}/teacher_base")):
        if not os.path.isfile(f"{out}/summary.json"):
            run(logs, os.path.basename(out), [PY, "sft/run_sft.py", "config/tiny/sft_argument.json", "--model_name_or_path",
                                              base, *data_flags(root), *out_flags(out)])
    if not os.path.isfile(f"{dist}/teacher/summary.json"):
        port = free_port()
        server = start_reward_server(logs, port)
        try:
            run(logs, "teacher_grpo", [PY, "ppo/run_ppo.py", "config/tiny/grpo_argument.json", "--actor_model_name_or_path",
                                       f"{dist}/teacher_sft", "--reward_server", f"http://127.0.0.1:{port}",
                                       "--train_datasets", f"Jsonfile:1.0:{root}/data/prompts.jsonl", "--eval_datasets",
                                       f"Jsonfile:1.0:{root}/data/valid.jsonl", *out_flags(f"{dist}/teacher")])
        finally:
            server.terminate()
            server.wait()


def write_teacher_samples(teacher, data_path, out_path, seed=1234, batch_size=256, max_new_tokens=10):
    """One sampled answer (temperature 1) of `teacher` to every prompt of `data_path`, as Jsonfile
    records `{"src": [prompt], "tgt": [answer]}`; returns the answers' mean token count (EOS included)."""
    import paddle

    from ppo.data import PromptOnlyDataset
    from ppo.evaluation import decode_responses
    from ppo.models.loading import load_causal_lm, load_tokenizer
    from ppo.rollout import RolloutEngine, SamplingParams

    tokenizer, model = load_tokenizer(teacher), load_causal_lm(teacher)
    model.eval()
    data = PromptOnlyDataset([f"Jsonfile:1.0:{data_path}"], tokenizer, prompt_template="USER: {input} ASSISTANT:")
    engine = RolloutEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id)
    params = SamplingParams(max_new_tokens=max_new_tokens, min_new_tokens=1, temperature=1.0, do_sample=True)
    collate, records, tokens = data.get_collator(), [], 0
    with paddle.no_grad():
        for start in range(0, len(data), batch_size):
            batch = collate([data[i] for i in range(start, min(start + batch_size, len(data)))])
            out = engine.generate(batch["input_ids"], batch["attention_mask"], params, seed=seed + start)
            tokens += int(out.response_lengths.sum())
            answers = decode_responses(tokenizer, out.response_ids, out.response_mask)
            records += [{"src": [s], "tgt": [a.strip()]} for s, a in zip(batch["src"], answers)]
    with open(out_path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return tokens / max(len(records), 1)


def student_runs(root, logs, seed, steps, batch_size, lr):
    """Stage 4 for one seed: `(on-policy dir, off-policy dir)`."""
    dist, common = f"{root}/distill", ["--max_steps", str(steps), "--per_device_train_batch_size", str(batch_size),
                                       "--learning_rate", str(lr), "--seed", str(seed), "--report_to", "none",
                                       "--eval_steps", str(steps), "--save_steps", str(steps), "--warmup_steps", "10"]
    on, off = f"{dist}/onpolicy-s{seed}", f"{dist}/offpolicy-s{seed}"
    if not os.path.isfile(f"{on}/summary.json"):
        run(logs, f"onpolicy-s{seed}", [PY, "sft/run_distill.py", "config/tiny/distill_argument.json", "--model_name_or_path",
                                        f"{root}/sft", "--teacher_model_name_or_path", f"{dist}/teacher/policy", *data_flags(root),
                                        *out_flags(on), "--lmbda", "1.0", *common])
    if not os.path.isfile(f"{off}/summary.json"):
        run(logs, f"offpolicy-s{seed}", [PY, "sft/run_sft.py", "config/tiny/sft_argument.json", "--model_name_or_path",
                                         f"{root}/sft", *data_flags(root, "teacher_samples.jsonl"), *out_flags(off),
                                         "--lr_scheduler_type", "cosine", "--logging_steps", "10", *common])
    return on, off


def held_out_accuracy(model, root, logs):
    """Greedy exact match of `model` on `test.jsonl` (overall, length >= 5, < 5)."""
    out = f"{model}/test_eval.json"
    if not os.path.isfile(out):
        run(logs, "eval_" + model.strip("/").replace("/", "_"), [
            PY, "scripts/evaluate.py", "--model", model, "--data", f"{root}/data/test.jsonl", "--verifier", "reverse",
            "--greedy", "--details", "--output", out])
    details = json.load(open(out))["prompts"]
    rows = [(len(d["label"].strip()), bool(d["correct"][0])) for d in details]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"accuracy": mean([c for _, c in rows]), "accuracy_long": mean([c for n, c in rows if n >= 5]),
            "accuracy_short": mean([c for n, c in rows if n < 5])}


def run_tokens(run_dir, sample_tokens, steps, batch_size):
    """Answer tokens a run trained on: `distill/tokens` of an on-policy run; steps x batch x the
    samples' mean answer tokens for SFT on the teacher's samples."""
    logged = [json.loads(ln).get("distill/tokens") for ln in open(f"{run_dir}/metrics.jsonl")]
    logged = [v for v in logged if v is not None]
    return logged[-1] if logged else steps * batch_size * sample_tokens


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_root", default="outputs/tiny")
    parser.add_argument("--seeds", default="42,43,44")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    args = parser.parse_args(argv)
    root, start = args.output_root.rstrip("/"), time.time()
    logs = f"{root}/distill/logs"
    build_and_train_teacher(root, logs)
    samples = f"{root}/data/teacher_samples.jsonl"
    stats_path = f"{root}/distill/teacher_samples.json"
    if not os.path.isfile(stats_path):
        mean_tokens = write_teacher_samples(f"{root}/distill/teacher/policy", f"{root}/data/sft.jsonl", samples)
        json.dump({"mean_answer_tokens": mean_tokens}, open(stats_path, "w"))
    sample_tokens = json.load(open(stats_path))["mean_answer_tokens"]
    table = {"teacher": held_out_accuracy(f"{root}/distill/teacher/policy", root, logs),
             "student_sft": held_out_accuracy(f"{root}/sft", root, logs), "runs": {}}
    for seed in [int(s) for s in args.seeds.split(",")]:
        on, off = student_runs(root, logs, seed, args.steps, args.batch_size, args.learning_rate)
        for kind, path in (("on_policy", on), ("off_policy", off)):
            row = held_out_accuracy(path, root, logs)
            row["tokens"] = run_tokens(path, sample_tokens, args.steps, args.batch_size)
            row["train_s"] = json.load(open(f"{path}/summary.json")).get("wall_time_s")
            table["runs"][f"{kind}-s{seed}"] = row
    table["wall_s"] = time.time() - start
    json.dump(table, open(f"{root}/distill/summary.json", "w"), indent=2)
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
