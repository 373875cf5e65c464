"""The online loop's evaluation: greedy answers to this rank's share of the eval prompts
(exact match with reference answers, the mean reward score when it can be computed) and, with
`eval_num_samples`, sampled answers (pass@k, maj@n, mean@n, judged by the rule scorers' verdicts
when they give one, else exact match); reduced over the ranks."""
from ..evaluation import LONG_ANSWER_LEN, evaluate_generation
from ..experience.stages import experience_from_rollout
from ..evaluation.sampled import evaluate_sampled, sampled_eval_settings


class Evaluator:
    """`dataset`: the eval prompts (None: no evaluation); `engine` / `sampling`: the rollout
    engine and its sampling; `passes`: the step's passes (`generation_weights`); `actor`: the
    trained actor; `scoring`: the run's `Scoring` (the reward's scores, its scorer's judge);
    `state`: the `RunState`; `ranks`: the run's `Ranks`; `offload`: the `OffloadPlan`;
    `settings`: `EvalSettings`."""

    def __init__(self, dataset, engine, sampling, tokenizer, passes, actor, *, scoring, offload, state, ranks, settings,
                 long_answer_len=LONG_ANSWER_LEN):
        self.dataset, self.engine, self.sampling, self.tokenizer = dataset, engine, sampling, tokenizer
        self.passes, self.actor, self.scoring, self.offload = passes, actor, scoring, offload
        self.state, self.ranks, self.settings, self.long_answer_len = state, ranks, settings, long_answer_len

    def score_fn(self):
        """The reward's scores of greedy answers (`evaluate_generation`'s `score_fn`), or None when
        its scorer needs reference answers some eval prompt lacks."""
        labelled = all(self.dataset[i]["label"] is not None for i in range(len(self.dataset)))
        if not labelled and self.scoring.objectives[0].scorer.needs_labels:
            return None
        eos, step = self.tokenizer.eos_token_id, self.state.step + 1
        return lambda batch, out: self.scoring.reward_scores(experience_from_rollout(batch, out, eos), step).numpy().tolist()

    def evaluate(self):
        """The evaluation's metrics (see the module docstring); {} without eval prompts."""
        if self.dataset is None:
            return {}
        s = self.settings
        indices = list(range(self.ranks.data_rank, len(self.dataset), self.ranks.data_world))
        self.actor.eval()
        with self.offload.scope("actor"), self.passes.generation_weights() as model:
            metrics, _ = evaluate_generation(
                model, self.tokenizer, self.dataset, batch_size=s.per_device_eval_batch_size,
                max_new_tokens=s.eval_max_new_tokens or s.max_dec_len, long_answer_len=self.long_answer_len,
                engine=self.engine, score_fn=self.score_fn(), indices=indices,
            )
            if s.eval_num_samples:  # eval/pass@k, eval/maj@n, eval/mean@n over sampled responses
                judge, params = sampled_eval_settings(s, self.sampling, self.scoring.objectives[0].scorer.judge)
                metrics.update(evaluate_sampled(
                    model, self.tokenizer, self.dataset, judge, s.eval_num_samples, params,
                    batch_size=s.per_device_eval_batch_size, seed=s.seed, engine=self.engine, indices=indices,
                    prefix="eval/")[0])
        metrics.pop("eval/num_samples", None)
        return self.ranks.reduce_metrics(metrics)
