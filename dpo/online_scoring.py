"""Scores of sampled answers for online DPO, from the source `run_ppo.py` would use: a
learned score model (`reward_model_scores`), the HTTP reward server (`RewardServerClient`)
or rule scorers in this process (`ppo.scorers.WeightedScorer`).

A score that cannot be computed or is not finite stops the run naming the source and
the item; it never becomes a silent zero.
"""
import numpy as np
import paddle

from ppo.evaluation import decode_responses
from ppo.experience import in_chunks, reward_model_scores
from ppo.scorers import ScorerError


class AnswerScorer:
    """Exactly one of `reward_model` (a frozen score model), `reward_client` or `rule_scorer`.

    `scores(exp)` returns float64 `[N]` numpy scores of an `Experience`'s answers, minus
    `missing_eos_penalty` for answers without EOS.
    """

    def __init__(self, tokenizer, reward_model=None, reward_client=None, rule_scorer=None, missing_eos_penalty=0.0,
                 chunk_size=64):
        given = [s for s in (reward_model, reward_client, rule_scorer) if s is not None]
        if len(given) != 1:
            raise ValueError(f"online DPO needs exactly one score source (reward model, server or rules), got {len(given)}")
        self.tokenizer = tokenizer
        self.reward_model, self.reward_client, self.rule_scorer = reward_model, reward_client, rule_scorer
        self.missing_eos_penalty = missing_eos_penalty
        self.chunk_size = chunk_size

    @property
    def source(self):
        if self.rule_scorer is not None:
            return f"the rule scorer {self.rule_scorer.spec}"
        if self.reward_client is not None:
            return f"the reward server {getattr(self.reward_client, 'url', '')}".rstrip()
        return "the reward model"

    @property
    def needs_labels(self):
        return self.reward_model is None

    def raw_scores(self, exp):
        """Scores `[N]` float64 of the answers in `exp`, before any penalty."""
        if self.reward_model is not None:
            with paddle.no_grad():
                scores = in_chunks(lambda e: reward_model_scores(self.reward_model, e), exp, self.chunk_size)
            return scores.numpy().astype("float64")
        missing = [i for i, label in enumerate(exp.label) if label is None]
        if missing:
            raise ValueError(f"{self.source} needs a reference answer (tgt) for every prompt; prompt {exp.src[missing[0]]!r} has none")
        responses = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
        if self.reward_client is not None:
            return np.asarray(self.reward_client.score(exp.src, exp.label, responses), dtype="float64")
        try:
            totals, _ = self.rule_scorer.score_batch(exp.src, exp.label, responses)
        except ScorerError as err:
            raise ScorerError(f"{err} (prompt {exp.src[err.item]!r}, response {responses[err.item]!r})",
                              err.scorer_name, err.item, err.bad_value) from err
        return np.asarray(totals, dtype="float64")

    def scores(self, exp):
        """`raw_scores` minus `missing_eos_penalty` where the answer has no EOS; raises on a
        score that is not finite, naming the source and the item."""
        scores = self.raw_scores(exp)
        bad = np.flatnonzero(~np.isfinite(scores))
        if len(bad):
            raise ValueError(
                f"{self.source} gave {len(bad)} of {len(scores)} scores that are not finite "
                f"(e.g. {scores[bad[0]]!r} for item {bad[0]}, prompt {exp.src[bad[0]]!r})"
            )
        if self.missing_eos_penalty:
            scores = scores - self.missing_eos_penalty * (~exp.ends_with_eos.numpy()).astype("float64")
        return scores
