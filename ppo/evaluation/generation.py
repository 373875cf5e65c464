"""Held-out generation evaluation shared by SFT, PPO, GRPO and DPO.

Greedy responses to prompt-only data that carries a reference answer (`label`,
the Jsonfile `tgt`) give exact-match accuracy, overall and split by the length
of the reference answer (`long` means at least `long_answer_len` characters; on
the demo task that is where the demonstrator's flaw lives).
"""
import math


def decode_responses(tokenizer, response_ids, response_mask):
    """Texts of the masked response tokens, special tokens dropped, added tokens that are not
    special kept as they were generated (Qwen3's `<think>...</think>` reaches the scorers whole, as
    in verl's and TRL's reward functions; no space put around them). Ids past the tokenizer (rows
    of a vocabulary padded beyond it: Qwen's 151,936, ERNIE 4.5's 103,424) have no text and are
    dropped, as transformers' fast tokenizers decode them (a SentencePiece tokenizer would raise).
    `[B, T]` -> `list[str]`."""
    ids = response_ids.numpy().tolist()
    mask = response_mask.numpy().tolist()
    n = len(tokenizer)
    return [tokenizer.decode([t for t, m in zip(row, mrow) if m > 0 and t < n], skip_special_tokens=True,
                             spaces_between_special_tokens=False) for row, mrow in zip(ids, mask)]


LONG_ANSWER_LEN = 5
"""The default `eval_long_answer_len`: reference answers at least this many characters long count as long."""


def exact_match_metrics(responses, labels, lengths, long_answer_len=LONG_ANSWER_LEN, prefix="eval"):
    """Exact-match accuracy (stripped strings) overall, on long and on short labels, and mean length."""
    correct = [r.strip() == l.strip() for r, l in zip(responses, labels)]
    long_ = [c for c, l in zip(correct, labels) if len(l.strip()) >= long_answer_len]
    short = [c for c, l in zip(correct, labels) if len(l.strip()) < long_answer_len]
    mean = lambda xs: sum(xs) / len(xs) if xs else math.nan
    return {
        f"{prefix}/accuracy": mean(correct),
        f"{prefix}/accuracy_long": mean(long_),
        f"{prefix}/accuracy_short": mean(short),
        f"{prefix}/response_length": mean(lengths),
        f"{prefix}/num_samples": float(len(correct)),
    }


def reward_model_score_fn(reward_model):
    """`score_fn(batch, out)` giving a score model's end scores of prompt+response."""
    import paddle

    from ..models.causal_lm import position_ids_from_mask

    def score(batch, out):
        mask = paddle.concat([batch["attention_mask"].astype("int64"), out.response_mask.astype("int64")], axis=1)
        res = reward_model(input_ids=out.sequences, attention_mask=mask, position_ids=position_ids_from_mask(mask))
        return res.end_scores.numpy().tolist()

    return score


def evaluate_generation(
    model, tokenizer, dataset, batch_size=64, max_new_tokens=16, use_rollout_engine=True, long_answer_len=LONG_ANSWER_LEN,
    reward_model=None, engine=None, score_fn=None, indices=None, tensor_parallel_group=None,
):
    """Greedy-decode the prompts of `dataset` (a `PromptOnlyDataset` with labels).

    `indices` selects a subset (e.g. this rank's share); `engine` reuses a
    `RolloutEngine` (else one is made, over `tensor_parallel_group` for a split model); `score_fn(batch, out) -> list[float]` (or a score model as
    `reward_model`) adds `eval/score`, the mean score. Returns `(metrics, records)`;
    `records` holds prompt, response, label, correct (and score).
    """
    import paddle

    from ..rollout import RolloutEngine, SamplingParams

    if engine is None:
        engine = RolloutEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                               use_rollout_engine=use_rollout_engine, tensor_parallel_group=tensor_parallel_group)
    if score_fn is None and reward_model is not None:
        score_fn = reward_model_score_fn(reward_model)
    params = SamplingParams(max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=False)
    collate = dataset.get_collator()
    indices = list(range(len(dataset))) if indices is None else list(indices)
    was_training = model.training
    model.eval()
    responses, labels, prompts, lengths, scores = [], [], [], [], []
    with paddle.no_grad():
        for start in range(0, len(indices), batch_size):
            batch = collate([dataset[i] for i in indices[start : start + batch_size]])
            out = engine.generate(batch["input_ids"], batch["attention_mask"], params)
            if score_fn is not None:
                scores += score_fn(batch, out)
            responses += decode_responses(tokenizer, out.response_ids, out.response_mask)
            lengths += out.response_lengths.numpy().tolist()
            labels += batch["label"]
            prompts += batch["prompt"]
    if was_training:
        model.train()
    metrics = {}
    if labels and all(label is not None for label in labels):
        metrics = exact_match_metrics(responses, labels, lengths, long_answer_len)
    records = [{"prompt": p, "response": r, "label": l} for p, r, l in zip(prompts, responses, labels)]
    for record in records:
        if record["label"] is not None:
            record["correct"] = record["response"].strip() == record["label"].strip()
    if scores:
        metrics["eval/score"] = sum(scores) / len(scores)
        for record, score in zip(records, scores):
            record["score"] = score
    return metrics, records
