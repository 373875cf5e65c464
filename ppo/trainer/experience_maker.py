"""Making experience, steps 1-4 of a PPO / GRPO step: rollout, scoring (reward model, reward
server or rule scorers, with the length penalties), dynamic sampling of groups whose scores
vary (DAPO), then the experience completed in one place (old and reference log-probs, critic
values, KL-shaped rewards, advantages). Every model pass goes through `self.passes`
(`ppo.passes.ModelPasses`)."""
import logging

import numpy as np
import paddle
import paddle.distributed as dist

from ..algos import (
    group_zero_std_fraction,
    kl_shaped_rewards,
    masked_centered_square_sum,
    masked_sum,
    masked_whiten,
    overlong_penalty,
    truncated_completion_mask,
    whiten_with_statistics,
)
from ..evaluation import decode_responses
from ..experience import experience_from_rollout, merge_rows
from .balance import balance_rows
from .update import K3_NAMES

logger = logging.getLogger("ppo")


class ExperienceMaking:
    """Steps 1-4 of `PPOTrainer`. Reads the trainer's `args`, `passes`, `engine`, `sampling`,
    `sampler`, `offload`, `models`, `tokenizer`, `estimator`, `kl_controller`,
    `reward_normalizer`, `reward_client` / `rule_scorer`; keeps `score_stats` and `gen_batches`."""

    # ------------------------------------------------------------------ 1. rollout
    def rollout(self, indices):
        """Generate `rollout_n` responses for each prompt index; returns an `Experience`."""
        n = self.args.rollout_n
        batch = self.collate_prompts([self.train_dataset[i] for i in indices])
        input_ids = paddle.repeat_interleave(batch["input_ids"], n, axis=0)
        prompt_mask = paddle.repeat_interleave(batch["attention_mask"], n, axis=0)
        # one draw for the global batch, each data rank keeping its rows' columns: a row samples the
        # same tokens whatever the data-parallel layout (tensor-parallel ranks of a data rank alike)
        seed, rows = self.args.seed + 1_000_003 * self.gen_batches, input_ids.shape[0]
        with self.offload.scope("actor"), self.generation_weights():
            out = self.engine.generate(input_ids, prompt_mask, self.sampling, seed=seed, row_offset=self.data_rank * rows,
                                       total_rows=self.data_world * rows)
        group_base = (self.gen_batches * self.data_world + self.data_rank) * len(indices)
        self.gen_batches += 1
        exp = experience_from_rollout(batch, out, self.tokenizer.eos_token_id, repeat=n, group_base=group_base)
        if out.logprobs_match_forward and self.args.use_rollout_logprobs:
            exp.old_logprobs = out.response_logprobs * exp.response_mask
        return exp

    # ------------------------------------------------------------------ 2. score
    def score(self, exp):
        """Scores `[N]` from the reward model, server or rule scorers, minus `missing_eos_penalty`,
        plus DAPO's overlong penalty; the parts' means go to `self.score_stats`."""
        self.score_stats = {}
        if self.reward_client is not None or self.rule_scorer is not None:
            if any(label is None for label in exp.label):
                raise ValueError("rule rewards and the reward server need a reference answer (tgt) for every prompt")
            responses = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
            if self.rule_scorer is not None:
                totals = self.rule_scores(exp, responses)
                source = f"the rule scorer {self.rule_scorer.spec}"
            else:
                totals = self.reward_client.score(exp.src, exp.label, responses)
                source = f"the reward server {getattr(self.reward_client, 'url', '')}".rstrip()
            raw = np.asarray(totals, dtype="float64")
            values = np.where(np.abs(raw) <= np.finfo("float32").max, raw, np.inf)  # what a float32 cast would give
            scores = paddle.to_tensor(values, dtype="float32")
        else:
            with paddle.no_grad(), self.offload.scope("reward"):
                scores = self.passes.reward_scores(exp)
            raw, source = None, "the reward model"
        if not bool(paddle.isfinite(scores).all()):
            bad = np.flatnonzero(~np.isfinite(scores.numpy()))
            example = float(raw[bad[0]]) if raw is not None else float(scores.numpy()[bad[0]])
            raise ValueError(
                f"step {self.step + 1}: {source} gave {len(bad)} of {scores.shape[0]} scores that are not "
                f"finite in float32 (e.g. {example!r} for item {bad[0]}; |x| must stay below 3.4e38); fix the scorer "
                "or scale its rewards"
            )
        if self.args.missing_eos_penalty:
            scores = scores - self.args.missing_eos_penalty * (~exp.ends_with_eos).astype("float32")
        if self.args.enable_overlong_reward_buffer:
            penalty = overlong_penalty(exp.response_mask.sum(axis=-1), self.args.max_dec_len,
                                       self.args.overlong_reward_buffer, self.args.overlong_penalty_factor)
            scores = scores + penalty
            self.score_stats["reward/overlong_penalty"] = penalty.mean()
            self.score_stats["reward/overlong_frac"] = (penalty < 0).astype("float32").mean()
        return scores

    def rule_scores(self, exp, responses):
        """Weighted rule scores in this process; a failing scorer stops the run naming the prompt."""
        from ..scorers import ScorerError

        try:
            totals, per_function = self.rule_scorer.score_batch(exp.src, exp.label, responses)
        except ScorerError as err:
            raise ScorerError(f"{err} (prompt {exp.src[err.item]!r}, response {responses[err.item]!r})",
                              err.scorer_name, err.item, err.bad_value) from err
        if len(per_function) > 1:
            self.score_stats.update({f"reward/{name}": float(np.mean(v)) for name, v in per_function.items()})
        return totals

    def scored(self, exp):
        """`exp` with its scores, at stage "scored"."""
        exp.scores = self.score(exp)
        if self.lagrange is not None:  # PPO-Lagrangian: the cost model scores every rollout too
            exp.costs = self.cost_scores(exp)
        return exp.advance("scored")

    def normalized_scores(self, scores):
        """Scores after the running normaliser, updated with every rank's batch first."""
        if self.reward_normalizer is None:
            return scores
        stats = paddle.to_tensor([scores.shape[0], float(scores.sum()), float((scores**2).sum())], dtype="float64")
        if self.world_size > 1:
            dist.all_reduce(stats)
        copies = self.world_size / self.data_world  # tensor-parallel ranks hold the same batch
        count, total, sq = (stats.numpy() / copies).tolist()
        mean = total / count
        self.reward_normalizer.merge(count, mean, max(sq / count - mean * mean, 0.0))
        return self.reward_normalizer.normalize(scores)

    def sample_with_dynamic_filter(self):
        """Rollout (+ score); with `dynamic_sampling`, zero-variance groups are replaced by
        groups from further batches (at most `max_gen_batches`; all ranks draw together)."""
        if not self.args.dynamic_sampling:  # the arguments allow it only for per-group estimators
            return self.scored(self.rollout(self.sampler.next_indices())), 1
        with self.generation_weights():  # one gathering of the actor's stages for all the draws
            return self._draw_until_groups_vary()

    def _draw_until_groups_vary(self):
        """`sample_with_dynamic_filter`'s draws: (the merged experience, the number of draws)."""
        exp = self.scored(self.rollout(self.sampler.next_indices()))
        want = self.args.per_device_prompt_batch_size
        kept, spare, draws = [], [], 1
        while True:
            groups = self.split_groups(exp)
            for g in groups:
                (kept if float(exp.scores.numpy()[g].std()) > 0 else spare).append((exp, g))
            need = paddle.to_tensor([int(len(kept) < want)], dtype="int64")
            if self.world_size > 1:
                dist.all_reduce(need, op=dist.ReduceOp.MAX)
            if int(need) == 0 or draws >= self.args.max_gen_batches:
                break
            exp = self.scored(self.rollout(self.sampler.next_indices()))
            draws += 1
        chosen = (kept + spare)[:want]
        return merge_rows([e.select(g) for e, g in chosen], self.tokenizer.pad_token_id), draws

    def balanced_across_ranks(self, exp):
        """With `balance_batch` and several data ranks, `exp`'s groups reordered over the ranks
        for even token counts (`ppo.trainer.balance`) and its stats; else `exp` and `{}`."""
        if not self.args.balance_batch or self.data_world == 1:
            return exp, {}
        return balance_rows(exp, self.data_rank, self.data_world, self.args.rollout_n, self.tokenizer.pad_token_id)

    def check_groups(self, exp):
        """Each group is `rollout_n` consecutive rows of one prompt, and no group id is on
        two ranks. Returns the number of groups on this rank."""
        n = self.args.rollout_n
        ids = exp.group_ids.numpy().reshape(-1, n)
        prompts = exp.sequences[:, : exp.prompt_len].numpy().reshape(ids.shape[0], n, -1)
        if not (ids == ids[:, :1]).all() or not (prompts == prompts[:, :1]).all():
            raise RuntimeError(f"step {self.step + 1}: a group is not {n} consecutive rows of one prompt")
        if self.world_size > 1:
            gathered = []
            dist.all_gather(gathered, paddle.to_tensor([self.data_rank, *ids[:, 0].tolist()], dtype="int64"))
            by_data_rank = {}
            for row in (g.numpy() for g in gathered):  # tensor-parallel copies of a data rank must agree
                if by_data_rank.setdefault(int(row[0]), row[1:].tolist()) != row[1:].tolist():
                    raise RuntimeError(f"step {self.step + 1}: tensor-parallel ranks of data rank {row[0]} hold different groups")
            all_ids = np.concatenate([np.asarray(v) for v in by_data_rank.values()])
            if len(np.unique(all_ids)) != len(all_ids):
                raise RuntimeError(f"step {self.step + 1}: a group id appears on more than one rank")
        return ids.shape[0]

    def split_groups(self, exp):
        n = self.args.rollout_n
        return [list(range(s, s + n)) for s in range(0, len(exp), n)]

    # ------------------------------------------------------------------ 3.-4. log-probs, values, rewards, advantages
    def compute_advantages(self, exp):
        """Complete a scored experience in one place: old and reference log-probs, critic
        values, shaped rewards and advantages (stage "scored" -> "complete"); returns stats."""
        exp.require("scored")
        self.fill_model_passes(exp)
        kl_coeff = self.kl_controller.value if self.kl_controller else self.args.kl_coeff
        kl = self.shape_rewards_and_advantages(exp, kl_coeff)
        exp.advance("complete")
        kl_sum = (kl * exp.response_mask).sum(axis=-1)
        stats = self.experience_stats(exp, kl_sum, kl_coeff)
        if self.lagrange is not None:
            stats.update(self.lagrangian_metrics(exp))
        if self.args.mask_truncated_completions:  # TRL: truncated responses leave every loss
            exp.response_mask = truncated_completion_mask(exp.response_mask, exp.ends_with_eos)
            stats["response_length/masked_truncated_frac"] = ((~exp.ends_with_eos).astype("float32")).mean()
        if self.kl_controller is not None:  # one update per step from the rank-averaged KL
            self.kl_controller.update(self.global_count(float(kl_sum.mean())), len(exp) * self.world_size)
        return stats

    def fill_model_passes(self, exp):
        """`exp.ref_logprobs`, `old_logprobs` (unless the rollout's own) and `values` (with a
        critic) `[N, Tr]`; with `first_update_forward_reusable`, the old ones come from the
        update's first forward, which the passes keep for the update."""
        need_ref = self.args.kl_coeff != 0 or self.args.kl_loss_coeff != 0
        reuse = self.first_update_forward_reusable(len(exp))
        with paddle.no_grad():
            if need_ref:  # a LoRA actor with its adapter disabled is the reference: both on the device
                with self.offload.scope("reference", *(() if self.models.reference is not None else ("actor",))):
                    exp.ref_logprobs = self.passes.logprobs("reference", exp)
            if exp.old_logprobs is None and not reuse:
                with self.offload.scope("actor"):
                    exp.old_logprobs = self.passes.logprobs("actor", exp)
            if self.models.critic is not None and not reuse:
                with self.offload.scope("critic"):
                    exp.values = self.passes.values(exp)
        if self.lagrange is not None:
            self.fill_cost_values(exp)
        if reuse:
            first_forward = self.passes.keep_first_forward(exp)
            if exp.old_logprobs is None:  # else the rollout's own log-probs (use_rollout_logprobs)
                exp.old_logprobs = first_forward["logprobs"].detach()
            if self.critic is not None:
                exp.values = first_forward["values"].detach()
        if not need_ref:
            exp.ref_logprobs = exp.old_logprobs

    def shape_rewards_and_advantages(self, exp, kl_coeff):
        """`exp.rewards` (KL per token, the normalised score at the last token), `advantages` and
        `returns` `[N, Tr]` from the estimator; returns the per-token KL `[N, Tr]`."""
        if self.lagrange is not None:  # PPO-Lagrangian (ppo.trainer.lagrange_step)
            return self.shape_lagrangian_rewards_and_advantages(exp, kl_coeff)
        args, mask = self.args, exp.response_mask
        with paddle.no_grad():
            scores = self.normalized_scores(exp.scores)
            exp.rewards, kl = kl_shaped_rewards(
                scores, exp.old_logprobs, exp.ref_logprobs, mask, kl_coeff, args.clip_range_score, kind=args.kl_estimator,
                clamp=args.kl_clamp if args.kl_estimator in K3_NAMES else None,
            )
            exp.advantages, exp.returns = self.advantages_and_returns(exp.rewards, exp.values, mask)
        return kl

    def advantages_and_returns(self, rewards, values, mask):
        """`(advantages, returns)` `[N, Tr]` of token `rewards` (and critic `values`, or None) from
        the run's estimator, whitened over the data ranks with `normalize_advantage`."""
        args = self.args
        advantages, returns = self.estimator(
            rewards, mask, values=values, group_size=args.rollout_n, gamma=args.gamma, gae_lambda=args.gae_lambda,
            scale_by_std=args.scale_reward_std,
        )
        if args.normalize_advantage:
            advantages = self.whitened_over_ranks(advantages, mask)
        return advantages, returns

    def whitened_over_ranks(self, x, mask):
        """`masked_whiten(x, mask)` with the mean and (unbiased) variance of every data rank's
        masked tokens, so that data parallelism whitens as one process would. `[N, Tr]`."""
        if self.world_size == 1:
            return masked_whiten(x, mask)
        copies = self.world_size / self.data_world  # tensor-/pipeline-parallel ranks hold the same rows
        count, total = self.summed_over_ranks([mask.astype("float32").sum(), masked_sum(x, mask)], copies)
        mean = total / max(count, 1e-8)
        (squares,) = self.summed_over_ranks([masked_centered_square_sum(x, mask, mean)], copies)
        return whiten_with_statistics(x, mask, mean, squares / max(count - 1.0, 1.0))

    def summed_over_ranks(self, scalars, copies):
        """Python floats: each scalar tensor summed over every rank, divided by `copies`."""
        t = paddle.to_tensor([float(v) for v in scalars], dtype="float64")
        dist.all_reduce(t)
        return (t.numpy() / copies).tolist()

    def experience_stats(self, exp, kl_sum, kl_coeff):
        """The step's `objective/*`, `response_length/*` (and `grpo/*` for per-group estimators)
        metrics of a complete experience; `kl_sum` `[N]`: each response's summed KL."""
        mask = exp.response_mask
        lengths = mask.sum(axis=-1)
        stats = {
            "objective/scores": exp.scores.mean(),
            "objective/kl": kl_sum.mean(),
            "objective/kl_coeff": kl_coeff,
            "objective/non_score_reward": (-kl_coeff * kl_sum).mean(),
            "objective/rlhf_reward": (exp.scores - kl_coeff * kl_sum).mean(),
            "objective/entropy": (-exp.old_logprobs * mask).sum(axis=-1).mean(),
            "val/num_eos_tokens": exp.ends_with_eos.astype("float32").sum(),
            "response_length/mean": lengths.mean(),
            "response_length/max": lengths.max(),
            "response_length/min": lengths.min(),
            "response_length/clip_ratio": ((~exp.ends_with_eos).astype("float32")).mean(),
            **self.score_stats,
        }
        if self.estimator.per_group:
            stats["grpo/frac_reward_zero_std"] = group_zero_std_fraction(exp.scores, self.args.rollout_n)
            stats["grpo/groups_per_rank"] = float(self.check_groups(exp))
        return stats
