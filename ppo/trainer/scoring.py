"""Step 2 of an online step: every scored objective's scores of a rollout (stage "scored").

One scorer interface for every source: `scorer(exp) -> (scores [N] float32, raw, stats)`, with
`source` (named in errors) and `needs_labels` (whether it scores against the prompts' reference
answers); a process reward model's scorer (`ProcessRewardModelScorer`) returns a fourth item,
its step rewards and step mask `[N, Tr]` (None unless `prm_reduction step`). `ScoreModel` runs a frozen score model of an objective through the passes (the reward
model, a cost model); `RewardServerScorer` and `RuleScorer` read the decoded responses (the
HTTP reward server, the rule scorers and verifiers of `ppo.scorers` in this process). A score
that cannot be computed, or is not finite in float32, stops the run naming the source and the
item: it never becomes a silent zero. `ScorePenalties` then takes `missing_eos_penalty` off the
responses without EOS and adds DAPO's overlong penalty (the reward's scores only)."""
import numpy as np
import paddle

from ..algos import add_to_last_step, overlong_penalty, reduce_step_scores
from ..evaluation import decode_responses
from ..experience.stages import ObjectiveTrace


class ScoreModel:
    """The frozen score model of `objective` ("reward", "cost") through `passes`, on the device
    for the pass (`offload`)."""

    needs_labels = False
    judge = None

    def __init__(self, passes, objective, offload):
        self.passes, self.objective, self.offload = passes, objective, offload
        self.source = f"the {objective} model"

    def __call__(self, exp):
        with paddle.no_grad(), self.offload.scope(self.objective):
            return self.passes.scores(self.objective, exp), None, {}


class ProcessRewardModelScorer:
    """A process reward model as the reward (`ppo.scoring.process_reward.ProcessRewardScorer`
    `prm`): each response's steps scored `P(good)`, and `reduction` (`prm_reduction`) says how
    they reward it: `last` / `min` give one score per response (at its last token, as a reward
    model's); `step` gives the last step's score as the response's score (metrics, penalties) and
    every step's score at the step's last token (`AdvantageStage` turns them into token rewards,
    or DeepSeekMath's process-supervision advantages for per-group estimators: `place`,
    `advantages`, ppo/trainer/reward_terms.py)."""

    needs_labels = False
    judge = None

    def __init__(self, prm, reduction, offload, eos_token_id=None):
        self.prm, self.reduction, self.offload, self.eos_token_id = prm, reduction, offload, eos_token_id
        self.source = f"the process reward model ({reduction} step)"

    def __call__(self, exp):
        with paddle.no_grad(), self.offload.scope("reward"):
            rewards, marks = self.prm.token_steps(exp.prompt_text, exp.response_ids, exp.response_mask, self.eos_token_id)
        scores = reduce_step_scores(rewards, marks, "min" if self.reduction == "min" else "last")
        stats = {"prm/step_score_mean": float((rewards * marks).sum() / marks.sum().clip(min=1.0)),
                 "prm/steps_per_response": float(marks.sum(axis=-1).mean())}
        return scores, None, stats, ((rewards, marks) if self.reduction == "step" else None)

    @staticmethod
    def place(trace, scores):
        """Where the (normalised) `scores` `[N]` go (ppo/trainer/reward_terms.py): at the last token
        (`last` / `min`), or with `step` nothing there and every step's score at the step's last
        token `[N, Tr]`, what the penalties and normaliser changed riding on the last step."""
        if trace.step_rewards is None:
            return scores, None
        steps = add_to_last_step(trace.step_rewards, trace.step_mask,
                                 scores - reduce_step_scores(trace.step_rewards, trace.step_mask, "last"))
        return paddle.zeros_like(scores), steps

    @staticmethod
    def advantages(stage, trace, token_rewards, mask):
        """DeepSeekMath's process-supervision advantages `[N, Tr]` of the step rewards under a
        per-group estimator (`stage.process_advantages`); None otherwise (the estimator's)."""
        if token_rewards is None or not stage.estimator.per_group:
            return None
        return stage.process_advantages(token_rewards, trace.step_mask, mask)


class TextScorer:
    """A scorer of the decoded responses against each prompt's reference answer (`tgt`); of a
    multi-turn rollout, the text after the prompt (`Experience.response_text`: every policy
    turn, tool answer and glue, as `Trajectory.response_text`)."""

    needs_labels = True
    judge = None

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, exp):
        missing = [i for i, label in enumerate(exp.label) if label is None]
        if missing:
            raise ValueError(f"{self.source} needs a reference answer (tgt) for every prompt; prompt "
                             f"{exp.src[missing[0]]!r} has none")
        responses = (exp.response_text if exp.response_text is not None  # a trajectory: turns and answers
                     else decode_responses(self.tokenizer, exp.response_ids, exp.response_mask))
        totals, stats = self.score_texts(exp, responses)
        raw = np.asarray(totals, dtype="float64")
        values = np.where(np.abs(raw) <= np.finfo("float32").max, raw, np.inf)  # what a float32 cast would give
        return paddle.to_tensor(values, dtype="float32"), raw, stats

    def score_texts(self, exp, responses):
        """`(totals [N] floats, stats)` of the decoded `responses`."""
        raise NotImplementedError


class RewardServerScorer(TextScorer):
    """The HTTP reward server (`ppo.serving.reward_client.RewardServerClient`)."""

    def __init__(self, tokenizer, client):
        super().__init__(tokenizer)
        self.client = client

    @property
    def source(self):
        return f"the reward server {getattr(self.client, 'url', '')}".rstrip()

    def score_texts(self, exp, responses):
        return self.client.score(exp.src, exp.label, responses), {}


class RuleScorer(TextScorer):
    """Weighted rule scorers in this process (`ppo.scorers.WeightedScorer`); with several,
    each one's mean is a `reward/<name>` stat. A failing scorer stops the run naming the prompt."""

    def __init__(self, tokenizer, weighted):
        super().__init__(tokenizer)
        self.weighted = weighted
        self.judge = weighted

    @property
    def source(self):
        return f"the rule scorer {self.weighted.spec}"

    def score_texts(self, exp, responses):
        from ..scorers import ScorerError

        try:
            totals, per_function = self.weighted.score_batch(exp.src, exp.label, responses)
        except ScorerError as err:
            raise ScorerError(f"{err} (prompt {exp.src[err.item]!r}, response {responses[err.item]!r})",
                              err.scorer_name, err.item, err.bad_value) from err
        stats = {f"reward/{name}": float(np.mean(v)) for name, v in per_function.items()} if len(per_function) > 1 else {}
        return totals, stats


class ScorePenalties:
    """`missing_eos_penalty` off every response without EOS, then DAPO's overlong penalty
    (`settings`: `PenaltySettings`)."""

    def __init__(self, settings):
        self.settings = settings

    def __call__(self, scores, exp):
        """`(scores [N], stats)` after the penalties."""
        s, stats = self.settings, {}
        if s.missing_eos_penalty:
            scores = scores - s.missing_eos_penalty * (~exp.ends_with_eos).astype("float32")
        if s.enable_overlong_reward_buffer:
            penalty = overlong_penalty(exp.response_mask.sum(axis=-1), s.max_dec_len, s.overlong_reward_buffer,
                                       s.overlong_penalty_factor)
            scores = scores + penalty
            stats["reward/overlong_penalty"] = penalty.mean()
            stats["reward/overlong_frac"] = (penalty < 0).astype("float32").mean()
        return scores, stats


def score_sources(model_args):
    """`(reward-server client, rule scorer)` of a run's model arguments (`use_rm_server`,
    `use_rule_reward` with `rule_reward_scorers` / `rule_reward_weights`): one of them, or
    neither when the reward model scores. A `module:function` scorer is found where the run starts."""
    from ..serving.reward_client import RewardServerClient
    from ..scorers import WeightedScorer

    client = rule_scorer = None
    if model_args.use_rm_server:
        client = RewardServerClient(model_args.reward_server, timeout=model_args.reward_server_timeout,
                                    max_retries=model_args.reward_server_retries, token=model_args.reward_server_token)
    elif model_args.use_rule_reward:
        rule_scorer = WeightedScorer(model_args.rule_reward_scorers, model_args.rule_reward_weights)
    return client, rule_scorer


def checked(scores, raw, source, step):
    """`scores` when every one is finite in float32; else a ValueError naming `source`, the
    step and an item (`raw`: the source's own values, for the example)."""
    if bool(paddle.isfinite(scores).all()):
        return scores
    bad = np.flatnonzero(~np.isfinite(scores.numpy()))
    example = float(raw[bad[0]]) if raw is not None else float(scores.numpy()[bad[0]])
    raise ValueError(
        f"step {step}: {source} gave {len(bad)} of {scores.shape[0]} scores that are not "
        f"finite in float32 (e.g. {example!r} for item {bad[0]}; |x| must stay below 3.4e38); fix the scorer "
        "or scale its rewards"
    )


class Scoring:
    """Every objective's scores (`objectives`: `ScoredObjective`s, the first the reward, whose
    `penalties` apply); `stats` holds the last scoring's (per-scorer means, penalties)."""

    def __init__(self, objectives):
        self.objectives = list(objectives)
        self.stats = {}

    def objective_trace(self, objective, exp, step):
        """One objective's `ObjectiveTrace` of `exp` at training `step` (1-based): its checked scores
        `[N]` with its penalties (and a process reward model's steps)."""
        scores, raw, stats, *steps = objective.scorer(exp)
        scores = checked(scores, raw, objective.scorer.source, step)
        if objective.penalties is not None:
            scores, penalty_stats = objective.penalties(scores, exp)
            stats = {**stats, **penalty_stats}
        self.stats.update(stats)
        step_rewards, step_mask = steps[0] if steps and steps[0] is not None else (None, None)
        return ObjectiveTrace(scores=scores, step_rewards=step_rewards, step_mask=step_mask)

    def score(self, exp, step):
        """`exp` with every objective's scores, at stage "scored"."""
        self.stats = {}
        exp.objectives = {o.name: self.objective_trace(o, exp, step) for o in self.objectives}
        return exp.advance("scored")

    def reward_scores(self, exp, step):
        """The reward's checked scores `[N]` with its penalties (the evaluation's `eval/score`)."""
        self.stats = {}
        return self.objective_trace(self.objectives[0], exp, step).scores
