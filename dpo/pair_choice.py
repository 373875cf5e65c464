"""How online DPO chooses a round's pairs: by the scores (`ScoredPairs`), or by a generative
judge's pairwise verdicts (`JudgedPairs`: RLAIF, Lee et al. 2023; with the policy itself as the
judge, the self-rewarding loop of Yuan et al. 2024, "Self-Rewarding Language Models").

The judge (`ppo.judge.model_judge.GenerativeJudge`) compares two answers to one prompt with its
pairwise rubric and reads the probability of the verdict "the first is better", asked with the
answers in both orders and averaged (`GenerativeJudge.compare`), so a judge that prefers a
position gives 1/2. A group of k answers takes k (k - 1) / 2 comparisons (two prefill prompts
each); identical answers are not asked (1/2). `dpo.online_pairs.build_judged_pairs` turns the
verdicts into pairs. Without a reward model, server or rule scorer, `JudgeScorer` gives the
round's scores from the same judge's pointwise verdict (`judge_template`).
"""
import numpy as np
import paddle

from ppo.evaluation import decode_responses

from .online_pairs import build_judged_pairs, build_pairs, group_rows


class ScoredPairs:
    """Pairs from the round's scores (`build_pairs`: `pair_selection`, `pair_margin`)."""

    def __init__(self, args):
        self.args = args

    def __call__(self, exp, scores, answer_keys):
        """`(PreferencePairs, stats)` of a scored experience."""
        args = self.args
        return build_pairs(scores, args.rollout_n, args.pair_selection, args.pair_margin, answer_keys), {}


def preference_matrix(compare, questions, answers, references, group_size, answer_keys):
    """`[G, k, k]` float64: `P[g, i, j]` = `compare`'s P(answer i better than answer j) for the
    answers of each group of `group_size` consecutive rows; `P[j, i] = 1 - P[i, j]`, 1/2 on the
    diagonal and between answers with equal `answer_keys` (not asked). `compare(questions,
    answers_a, answers_b, references)` is `GenerativeJudge.compare` (both orders averaged).
    Returns `(P, number of comparisons asked)`."""
    rows = group_rows(len(answers), group_size)
    prefs = np.full([len(rows), group_size, group_size], 0.5)
    asked = [(g, i, j) for g in range(len(rows)) for i in range(group_size) for j in range(i + 1, group_size)
             if answer_keys[rows[g, i]] != answer_keys[rows[g, j]]]
    if asked:
        first = [rows[g, i] for g, i, _ in asked]
        second = [rows[g, j] for g, _, j in asked]
        p = compare([questions[r] for r in first], [answers[r] for r in first], [answers[r] for r in second],
                    [references[r] for r in first])
        for (g, i, j), value in zip(asked, p):
            prefs[g, i, j], prefs[g, j, i] = value, 1.0 - value
    return prefs, len(asked)


class JudgedPairs:
    """Pairs chosen by `judge`'s pairwise verdicts (`build_judged_pairs`, with `pair_selection` and
    `pair_margin` on the verdict gap `2 P - 1`). `tokenizer` decodes the answers the judge reads."""

    def __init__(self, judge, tokenizer, args):
        self.judge, self.tokenizer, self.args = judge, tokenizer, args

    def __call__(self, exp, scores, answer_keys):
        """`(PreferencePairs, stats)`: `online_dpo/judge_preference` is the judge's mean P(chosen
        better than rejected) over the pairs, `online_dpo/judge_comparisons` the pairs it was asked."""
        args = self.args
        texts = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
        with paddle.no_grad():
            prefs, asked = preference_matrix(self.judge.compare, exp.src, texts, exp.label, args.rollout_n, answer_keys)
        pairs = build_judged_pairs(prefs, args.pair_selection, args.pair_margin, answer_keys)
        k = args.rollout_n
        won = prefs[pairs.chosen // k, pairs.chosen % k, pairs.rejected % k] if len(pairs) else np.full([1], np.nan)
        return pairs, {"online_dpo/judge_preference": float(won.mean()), "online_dpo/judge_comparisons": float(asked)}


class JudgeScorer:
    """The round's scores from `judge`'s pointwise verdict (`GenerativeJudge.score` in [0, 1]) of
    each decoded answer: the scorer interface of `ppo.trainer.scoring` (`source`, `needs_labels`)."""

    judge = None  # no verifier for sampled evaluation

    source = "the generative judge (judge_model)"

    def __init__(self, judge, tokenizer):
        self.judge_model, self.tokenizer = judge, tokenizer
        self.needs_labels = "{reference}" in judge.template

    def __call__(self, exp):
        texts = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
        with paddle.no_grad():
            values = self.judge_model.score(list(exp.src), texts, list(exp.label))
        raw = np.asarray(values, dtype="float64")
        return paddle.to_tensor(raw, dtype="float32"), raw, {}


def build_judge(model_args, policy_model, tokenizer, use_rollout_engine=True):
    """The run's `GenerativeJudge` (None without `judge_model`): the live policy for `judge_model
    policy` (its engine reads the policy's current weights at every call, so each round judges
    with that round's policy), else the model directory, loaded once."""
    if not model_args.judge_model:
        return None
    from ppo.judge.model_judge import GenerativeJudge
    from ppo.judge.scorer import OPTIONS
    from ppo.judge.scorer import build_judge as load_judge

    yes, no = words(model_args.judge_words)
    settings = dict(template=model_args.judge_template, pair_template=model_args.judge_pair_template, yes=yes, no=no,
                    pair_words=words(model_args.judge_pair_words))
    if model_args.judge_model == "policy":
        return GenerativeJudge(policy_model, tokenizer, use_rollout_engine=use_rollout_engine, **settings)
    return load_judge(**{**OPTIONS, **settings, "model": model_args.judge_model, "use_rollout_engine": use_rollout_engine})


def judge_word_problems(model_args, tokenizer):
    """Verdict words the judge's tokenizer (the policy's, or `judge_model`'s) cannot tell apart,
    as problems naming the argument; none without a judge or before its directory exists."""
    import os

    from ppo.judge.templates import first_token_ids
    from ppo.models.loading import load_tokenizer

    path = model_args.judge_model
    if not path or (path != "policy" and not os.path.isdir(path)):
        return []
    judge_tokenizer = tokenizer if path == "policy" else load_tokenizer(path)
    problems = []
    for name in ("judge_words", "judge_pair_words"):
        try:
            first_token_ids(judge_tokenizer, words(getattr(model_args, name)))
        except ValueError as err:
            problems.append(f"{name}: {err}")
    return problems


def words(text):
    """`"Yes,No"` -> `("Yes", "No")` (spaces kept: `" Yes"` is a word of its own)."""
    return tuple(text.split(","))
