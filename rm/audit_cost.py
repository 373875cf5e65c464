"""Check a cost model (Safe RLHF) on held-out safety pairs before PPO-Lagrangian trusts it.

    python rm/audit_cost.py --model_name_or_path outputs/tiny/cost --prompt_template "USER: {input} ASSISTANT:" \
        --eval_datasets PKU-SafeRLHF/safety/test:1.0:outputs/tiny/data/safety_preference_eval.jsonl

Every pair's safer and unsafer answers are scored (end costs, `rm/audit_reward.py`'s
`score_sequences`). The JSON report (`output_dir/cost_audit.json`) gives the pairwise
accuracy (the unsafer answer costs more), the sign accuracy (cost > 0 exactly for the
answers labelled unsafe: the constraint PPO-Lagrangian enforces is "expected cost <= 0"),
the mean margin, and per label the count, mean cost and share on the right side of 0.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("audit-cost")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    import numpy as np  # noqa: E402
    import paddle  # noqa: E402

    from ppo.algos import cost_metrics  # noqa: E402
    from ppo.entry.argument_groups import split_specs  # noqa: E402
    from ppo.common.argument_parsing import parse_arguments  # noqa: E402
    from ppo.common.process_exit import run_and_exit  # noqa: E402
    from ppo.data import SafetyPreferenceDataset  # noqa: E402
    from ppo.models.adapters import load_merged_score_model  # noqa: E402
    from ppo.models.loading import load_tokenizer  # noqa: E402
    from rm.audit_arguments import CostAuditArgument, validate_arguments  # noqa: E402
    from rm.audit_reward import refuse_overflowing_tokenizer, score_sequences, write_report  # noqa: E402


def label_summary(costs, unsafe):
    """Count, mean cost and the share on the right side of 0 of the answers of one label."""
    right = costs > 0 if unsafe else costs < 0
    key = "above_zero_frac" if unsafe else "below_zero_frac"
    return {"count": int(costs.size), "mean_cost": float(costs.mean()) if costs.size else None,
            key: float(right.mean()) if costs.size else None}


def audit_costs(model, dataset, pad_id, batch_size=CostAuditArgument.batch_size):
    """The report dict of a cost model on a `SafetyPreferenceDataset` (see the module docstring)."""
    items = [dataset[i] for i in range(len(dataset))]
    safer = score_sequences(model, [it["better_input_ids"].tolist() for it in items], pad_id, batch_size)
    unsafer = score_sequences(model, [it["worse_input_ids"].tolist() for it in items], pad_id, batch_size)
    safer_sign = np.asarray([it["better_sign"] for it in items], dtype="int64")
    unsafer_sign = np.asarray([it["worse_sign"] for it in items], dtype="int64")
    stats = cost_metrics(*(paddle.to_tensor(x) for x in (safer, unsafer, safer_sign, unsafer_sign)))
    costs, signs = np.concatenate([safer, unsafer]), np.concatenate([safer_sign, unsafer_sign])
    return {
        "num_pairs": len(items),
        "pairwise_accuracy": float(stats["cost/accuracy"]),
        "sign_accuracy": float(stats["cost/sign_accuracy"]),
        "margin": float(stats["cost/margin"]),
        "safe": label_summary(costs[signs > 0], unsafe=False),
        "unsafe": label_summary(costs[signs < 0], unsafe=True),
    }


def main(argv=None):
    (args,) = parse_arguments((CostAuditArgument,), argv, validate=validate_arguments)
    tokenizer = load_tokenizer(args.model_name_or_path)
    refuse_overflowing_tokenizer(tokenizer, args.model_name_or_path)
    dataset = SafetyPreferenceDataset(
        split_specs(args.eval_datasets), tokenizer, max_length=args.max_length, prompt_template=args.prompt_template,
        use_chat_template=args.use_chat_template,
    )
    model = load_merged_score_model(args.model_name_or_path)
    model.eval()
    report = audit_costs(model, dataset, tokenizer.pad_token_id, args.batch_size)
    return write_report(report, args.output_dir or args.model_name_or_path, "cost_audit.json")


if __name__ == "__main__":
    run_and_exit(main)
