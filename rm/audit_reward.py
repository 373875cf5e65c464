"""Probe a reward model with degenerate answers before PPO trusts it.

    python rm/audit_reward.py --model_name_or_path outputs/tiny/rm \
        --eval_datasets Jsonfile:1.0:outputs/tiny/data/test.jsonl --prompt_template "USER: {input} ASSISTANT:"

For every held-out prompt with a reference answer, the real answer is scored next
to degenerate ones: empty (no token after the prompt), EOS only, the prompt
echoed, one token repeated, the answer cut in half, and a very long answer. The
JSON report (`output_dir/audit.json`) gives each kind's mean score and how often
it outranks the real answer. An empty answer scoring as high as a real one is
the failure that sinks PPO runs. A process reward model (trained with `process_reward`) is
audited on held-out step-labelled records instead (`eval_datasets` as `paddlenlp-prm:1:FILE`):
its step accuracy, on good and on bad steps, per response, and whether its first bad step is the
first real one (`rm/audit_steps.py`).
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import json  # noqa: E402

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("audit-reward")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    import numpy as np  # noqa: E402
    import paddle  # noqa: E402

    from ppo.entry.argument_groups import split_specs  # noqa: E402
    from ppo.common.argument_parsing import parse_arguments  # noqa: E402
    from ppo.common.argument_problems import ArgumentError, joined_problems  # noqa: E402
    from ppo.common.startup_checks import token_and_position_problems  # noqa: E402
    from ppo.common.process_exit import run_and_exit  # noqa: E402
    from ppo.data import PromptOnlyDataset  # noqa: E402
    from ppo.models.loading import load_tokenizer  # noqa: E402
    from ppo.models.adapters import load_merged_score_model  # noqa: E402
    from rm.audit_arguments import AuditArgument, validate_arguments  # noqa: E402

PROBES = ("empty", "eos_only", "prompt_echo", "repeated_token", "truncated_half", "very_long")


def probe_answers(real_ids, src_ids, eos_id, long_tokens):
    """Answer token lists (after the prompt) for the real answer and each probe."""
    first = real_ids[:1] or [eos_id]
    return {
        "real": real_ids + [eos_id],
        "empty": [],
        "eos_only": [eos_id],
        "prompt_echo": src_ids + [eos_id],
        "repeated_token": first * max(2, len(real_ids)) + [eos_id],
        "truncated_half": real_ids[: len(real_ids) // 2] + [eos_id],
        "very_long": (real_ids * (long_tokens // max(1, len(real_ids)) + 1))[:long_tokens] + [eos_id],
    }


def score_sequences(model, sequences, pad_id, batch_size):
    """End scores of token lists (right-padded in batches). -> np.ndarray [N]."""
    out = []
    for s in range(0, len(sequences), batch_size):
        chunk = sequences[s : s + batch_size]
        width = max(len(x) for x in chunk)
        ids = np.full((len(chunk), width), pad_id, dtype="int64")
        mask = np.zeros((len(chunk), width), dtype="int64")
        for i, x in enumerate(chunk):
            ids[i, : len(x)], mask[i, : len(x)] = x, 1
        with paddle.no_grad():
            res = model(input_ids=paddle.to_tensor(ids), attention_mask=paddle.to_tensor(mask))
        out.append(res.end_scores.numpy())
    return np.concatenate(out)


def audit(model, tokenizer, dataset, batch_size=AuditArgument.batch_size,
          long_answer_tokens=AuditArgument.long_answer_tokens):
    """The report dict: per probe kind, mean score and the fraction of prompts where it outranks the real answer."""
    kinds, sequences = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        if item["label"] is None:
            raise ValueError(f"prompt {i} has no reference answer (tgt); the audit needs one per prompt")
        prompt_ids = item["input_ids"].tolist()
        real = tokenizer(item["label"], add_special_tokens=False)["input_ids"]
        src = tokenizer(item["src"], add_special_tokens=False)["input_ids"]
        for kind, answer in probe_answers(real, src, tokenizer.eos_token_id, long_answer_tokens).items():
            kinds.append(kind)
            sequences.append(prompt_ids + answer)
    scores = score_sequences(model, sequences, tokenizer.pad_token_id, batch_size)
    per_kind = {k: scores[[j for j, kk in enumerate(kinds) if kk == k]] for k in ("real",) + PROBES}
    real = per_kind["real"]
    report = {"num_prompts": len(dataset), "real": {"mean_score": float(real.mean())}}
    for kind in PROBES:
        s = per_kind[kind]
        report[kind] = {
            "mean_score": float(s.mean()),
            "outranks_real_frac": float((s > real).mean()),
            "below_real_frac": float((s < real).mean()),
        }
    report["empty_and_eos_below_real_frac"] = float(((per_kind["empty"] < real) & (per_kind["eos_only"] < real)).mean())
    return report


def main(argv=None):
    (args,) = parse_arguments((AuditArgument,), argv, validate=validate_arguments)
    tokenizer = load_tokenizer(args.model_name_or_path)
    refuse_overflowing_tokenizer(tokenizer, args.model_name_or_path)
    model = load_merged_score_model(args.model_name_or_path)
    model.eval()
    if getattr(model.config, "process_reward", False):  # a PRM: step accuracy on held-out step-labelled records
        from rm.audit_steps import audit_process_reward

        report = audit_process_reward(model, tokenizer, split_specs(args.eval_datasets), args.batch_size)
        return write_report(report, args.output_dir or args.model_name_or_path, "audit.json")
    dataset = PromptOnlyDataset(
        split_specs(args.eval_datasets), tokenizer, prompt_template=args.prompt_template, max_prompt_len=args.max_prompt_len
    )
    report = audit(model, tokenizer, dataset, args.batch_size, args.long_answer_tokens)
    return write_report(report, args.output_dir or args.model_name_or_path, "audit.json")


def refuse_overflowing_tokenizer(tokenizer, model_path):
    """ArgumentError before the model loads when the model's own tokenizer gives ids past its
    embedding (`startup_checks.token_and_position_problems`): Paddle's lookup would fail mid-audit."""
    problems = token_and_position_problems(tokenizer, [("model_name_or_path", model_path)], 0, "")
    if problems:
        raise ArgumentError(joined_problems(problems))


def write_report(report, out_dir, name):
    """Write the audit `report` (a JSON-able dict) as `out_dir/name`, print it and return it."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    run_and_exit(main)
