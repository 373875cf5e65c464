"""The audit of a process reward model (`rm/audit_reward.py` on a model trained with
`process_reward`): its step accuracy on held-out step-labelled records (`paddlenlp-prm`,
Math-Shepherd's format), per good and per bad step, per response, and where the first bad step
is found."""
import numpy as np
import paddle

from ppo.data import ProcessRewardDataset
from ppo.data.process_reward import REWARD_TOKENS
from rm.audit_arguments import AuditArgument
from rm.process_reward_trainer import evaluate_steps, step_logits


def first_error_accuracy(logits, labels, mask):
    """Fraction of responses with a bad step whose first predicted-bad step is their first bad step
    (the PRM finds where the solution goes wrong, ProcessBench's question)."""
    hits, total = 0, 0
    for lg, y, m in zip(logits, labels, mask):
        n = int(m.sum())
        bad = np.nonzero(y[:n] < 0.5)[0]
        if not len(bad):
            continue
        total += 1
        predicted = np.nonzero(lg[:n] <= 0)[0]
        hits += int(len(predicted) > 0 and predicted[0] == bad[0])
    return hits / total if total else None


def audit_process_reward(model, tokenizer, specs, batch_size=AuditArgument.batch_size, truncate_prompt_to=None):
    """The report dict of a PRM on the held-out records of `specs` (placeholder and reward tokens
    from the model's config)."""
    config = model.config
    dataset = ProcessRewardDataset(specs, tokenizer, max_length=None, placeholder_token=config.placeholder_token,
                                   reward_tokens=getattr(config, "reward_tokens", REWARD_TOKENS), truncate_prompt_to=truncate_prompt_to)
    collate = dataset.get_collator()
    batches = [collate([dataset[i] for i in range(s, min(s + batch_size, len(dataset)))]) for s in range(0, len(dataset), batch_size)]
    metrics = evaluate_steps(model, batches, lambda x: x)
    rows = []
    with paddle.no_grad():
        for batch in batches:
            parts = (step_logits(model, batch).numpy(), batch["step_labels"].numpy(), batch["step_mask"].numpy())
            rows += list(zip(*parts))
    report = {"num_records": len(dataset), "num_steps": int(metrics["prm/eval_steps"])}
    report.update({k[len("prm/"):]: v for k, v in metrics.items() if k != "prm/eval_steps"})
    report["first_error_accuracy"] = first_error_accuracy(*zip(*rows)) if rows else None
    return report
