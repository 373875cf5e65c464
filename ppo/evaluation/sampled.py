"""Evaluation with n sampled responses per prompt: pass@k, maj@k, mean@k (``ppo/evaluation/metrics.py``).

Used by the PPO/GRPO loop (``eval_num_samples``) and by ``scripts/evaluate.py``. A judge says,
for a batch of ``(src, label, response)`` triples, each response's score, whether it is correct
and the answer it gives (for majority votes):

- :func:`scorer_judge` reads them from a ``WeightedScorer`` (the verifiers' ``correct_at`` and
  ``extract_answer``, ``ppo/scoring/registry.py``);
- :func:`exact_match_judge` is the rule of the greedy evaluation (``ppo/evaluation/``): the
  stripped response equals the stripped label.
"""
from .generation import decode_responses
from .metrics import sampled_metrics


def scorer_judge(scorer):
    """A judge from a `WeightedScorer`: its totals, its verdicts and the answers its scorers read.
    A scorer that raises stops the evaluation (`ScorerError`): no made-up verdict."""
    scorer.verdicts({n: [] for n in scorer.names})  # raises now when no scorer says what is correct

    def judge(src, labels, responses):
        totals, per_function = scorer.score_batch(src, labels, responses)
        return totals, scorer.verdicts(per_function), scorer.answers(src, responses)

    return judge


def exact_match_judge(src, labels, responses):
    """Score 1.0 / verdict True when ``response.strip() == label.strip()``; the answer is the stripped response."""
    correct = [r.strip() == l.strip() for r, l in zip(responses, labels)]
    return [float(c) for c in correct], correct, [r.strip() for r in responses]


def sampled_eval_settings(args, sampling, rule_scorer=None):
    """`(judge, params)` of the PPO/GRPO loop's sampled evaluation: the rule scorers' verdicts
    when they say what is correct, else exact match; the rollout's `sampling` with
    `eval_max_new_tokens` (0: `max_dec_len`) new tokens."""
    from dataclasses import replace

    judge = scorer_judge(rule_scorer) if rule_scorer is not None and rule_scorer.judges_correctness else exact_match_judge
    return judge, replace(sampling, max_new_tokens=args.eval_max_new_tokens or args.max_dec_len)


def _sample_batch(engine, tokenizer, batch, num_samples, params, seed):
    """`num_samples` decoded responses per prompt of `batch`, as a list per prompt."""
    import paddle

    ids = paddle.repeat_interleave(batch["input_ids"], num_samples, axis=0)
    mask = paddle.repeat_interleave(batch["attention_mask"], num_samples, axis=0)
    out = engine.generate(ids, mask, params, seed=seed)
    texts = decode_responses(tokenizer, out.response_ids, out.response_mask)
    lengths = out.response_lengths.numpy().tolist()
    rows = range(len(batch["prompt"]))
    return ([texts[i * num_samples : (i + 1) * num_samples] for i in rows],
            [lengths[i * num_samples : (i + 1) * num_samples] for i in rows])


def sample_and_judge(engine, tokenizer, dataset, judge, num_samples, params, batch_size=64, seed=0, indices=None):
    """One record per prompt of `dataset` (a `PromptOnlyDataset` with labels; `indices` a subset):
    prompt, label, and per sample the response, score, verdict, answer and length in tokens.
    Batch b of prompts is sampled with seed `seed + b`."""
    import paddle

    collate = dataset.get_collator()
    indices = list(range(len(dataset))) if indices is None else list(indices)
    records = []
    with paddle.no_grad():
        for b, start in enumerate(range(0, len(indices), batch_size)):
            batch = collate([dataset[i] for i in indices[start : start + batch_size]])
            if any(label is None for label in batch["label"]):
                raise ValueError("sampled evaluation needs a reference answer (tgt) for every prompt")
            responses, lengths = _sample_batch(engine, tokenizer, batch, num_samples, params, seed + b)
            flat = lambda rows: [x for row in rows for x in row]  # noqa: E731
            src = flat([[s] * num_samples for s in batch["src"]])
            labels = flat([[l] * num_samples for l in batch["label"]])
            scores, correct, answers = judge(src, labels, flat(responses))
            for i, prompt in enumerate(batch["prompt"]):
                part = slice(i * num_samples, (i + 1) * num_samples)
                records.append({"prompt": prompt, "label": batch["label"][i], "responses": responses[i],
                                "scores": [float(s) for s in scores[part]], "correct": [bool(c) for c in correct[part]],
                                "answers": answers[part], "lengths": lengths[i]})
    return records


def records_metrics(records, ks=None, prefix=""):
    """pass@k, maj@n, mean@n (``ppo.evaluation.metrics.sampled_metrics``), the mean score and the mean
    response length in tokens, over the records of :func:`sample_and_judge`."""
    metrics = sampled_metrics([r["correct"] for r in records], [r["answers"] for r in records], ks, prefix)
    scores = [s for r in records for s in r["scores"]]
    lengths = [x for r in records for x in r["lengths"]]
    metrics[f"{prefix}mean_score"] = sum(scores) / len(scores)
    metrics[f"{prefix}response_length"] = sum(lengths) / len(lengths)
    return metrics


def evaluate_sampled(model, tokenizer, dataset, judge, num_samples, params, batch_size=64, seed=0, indices=None,
                     engine=None, ks=None, prefix="", use_rollout_engine=True):
    """`(metrics, records)` of :func:`sample_and_judge` and :func:`records_metrics`, the model in
    eval mode for the block (restored after)."""
    from ..rollout import RolloutEngine

    if engine is None:
        engine = RolloutEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                               use_rollout_engine=use_rollout_engine)
    was_training = model.training
    model.eval()
    try:
        records = sample_and_judge(engine, tokenizer, dataset, judge, num_samples, params, batch_size, seed, indices)
    finally:
        if was_training:
            model.train()
    return records_metrics(records, ks, prefix), records
