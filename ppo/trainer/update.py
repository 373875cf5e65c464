"""The update, step 5 of a PPO / GRPO step: `update_iters` epochs of shuffled optimiser steps
(`minibatch_plan`), each one's gradients from `self.passes.backward_step` with the losses
handed in (`update_losses`: actor objective with its entropy and KL terms, critic objective,
ptx batches), then the optimiser steps, skipped when the loss or a gradient is not finite
(`handle_non_finite` stops the run after `max_nan_skips` in a row)."""
import logging
import math

import numpy as np
import paddle
import paddle.distributed as dist

from ..algos import entropy_bonus_from_token_entropy, kl_loss, masked_mean, ppo_policy_loss, value_loss
from ..algos.kl import K3_NAMES
from ..experience import response_logprobs, response_values
from ..grad_sync import prepare_step, squared_grad_norm
from ..models.pipeline import pipeline_group
from ..models.tensor_parallel import model_parallel_group
from ..passes import UpdateLosses

logger = logging.getLogger("ppo")


class NonFiniteError(RuntimeError):
    """Too many consecutive updates with a NaN/Inf loss or gradient."""


def first_non_finite(named_tensors):
    """Name of the first tensor holding NaN/Inf, or None."""
    for name, t in named_tensors:
        if t is not None and not bool(paddle.isfinite(t).all()):
            return name
    return None


def minibatch_plan(n_rows, micro_rows, accumulation, seed):
    """`n_rows` row indices shuffled with `seed`, cut into micro-batches of `micro_rows` and
    grouped into optimiser steps of `accumulation` micro-batches: a list (steps) of lists
    (micro-batches) of row-index lists."""
    perm = np.random.RandomState(seed).permutation(n_rows)
    micro_batches = [perm[s : s + micro_rows].tolist() for s in range(0, n_rows, micro_rows)]
    return [micro_batches[s : s + accumulation] for s in range(0, len(micro_batches), accumulation)]


class PolicyUpdate:
    """Step 5 of `PPOTrainer`. Reads the trainer's `args`, `passes`, `actor` / `critic` and
    their optimizers, `offload`, `ptx_sampler` / `ptx_dataset`, `step`, `data_rank`,
    `world_size`, `divergence`; keeps `grad_norms`, `diverged` and `nan_streak`."""

    # ------------------------------------------------------------------ 5. update
    def first_update_forward_reusable(self, n_rows):
        """True when the update's first optimiser step takes all `n_rows` rows in one
        micro-batch with the rollout-time weights (so its forward is the old-policy pass)."""
        args = self.args
        return (
            bool(args.reuse_first_update_forward) and n_rows <= args.update_micro_rows and not self.offload.enabled
            and self.passes.first_forward_reusable()
        )

    def minibatch_plan(self, n_rows, epoch):
        """This step's and `epoch`'s shuffled optimiser steps of `update_accumulation_steps`
        micro-batches of `update_micro_rows` rows (see `minibatch_plan`; PaddleNLP's
        `global_mini_batch_size` sets both)."""
        seed = self.args.seed + 10007 * self.step + 101 * epoch + self.data_rank
        return minibatch_plan(n_rows, self.args.update_micro_rows, self.args.update_accumulation_steps, seed)

    def global_count(self, value):
        """Sum of `value` over ranks divided by the world size (the per-rank share that makes
        a data-parallel gradient average equal the global token-mean)."""
        t = paddle.to_tensor([float(value)], dtype="float64")
        if self.world_size > 1:
            dist.all_reduce(t)
        return float(t.numpy()[0]) / self.world_size

    def _agg(self, num_tokens, num_seqs):
        """Aggregation keywords shared by every loss term."""
        return dict(loss_agg_mode=self.args.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=self.args.loss_scale)

    def actor_loss(self, mb, num_tokens, num_seqs, forward=None):
        """pg_loss_coeff * policy loss - entropy_coeff * entropy + kl_loss_coeff * KL and its stats;
        `forward`: the micro-batch's training forward (`{"logprobs", "entropy"}`, `[n, Tr]`) as the
        passes computed it; None runs it here on the trained actor."""
        args = self.args
        agg = self._agg(num_tokens, num_seqs)
        if forward is None:
            logprobs, entropy = response_logprobs(self.actor, mb, args.temperature, args.logprob_chunk_size, with_entropy=True)
        else:
            logprobs, entropy = forward["logprobs"], forward["entropy"]
        pg_loss, stats = ppo_policy_loss(
            logprobs, mb.old_logprobs, mb.advantages, mb.response_mask,
            clip_range_ratio=args.clip_range_ratio, clip_range_ratio_low=args.clip_range_ratio_low,
            clip_range_ratio_high=args.clip_range_ratio_high, dual_clip=args.dual_clip,
            importance_sampling_level=args.importance_sampling_level, **agg,
        )
        loss = args.pg_loss_coeff * pg_loss
        if args.entropy_coeff:
            bonus, entropy_stats = entropy_bonus_from_token_entropy(entropy, mb.response_mask, **agg)
            loss = loss - args.entropy_coeff * bonus
            stats.update(entropy_stats)
        if args.kl_loss_coeff:
            kl_term, kl_stats = kl_loss(logprobs, mb.ref_logprobs, mb.response_mask, kind=args.kl_loss_type,
                                        clamp=args.kl_clamp if args.kl_loss_type in K3_NAMES else None, **agg)
            loss = loss + args.kl_loss_coeff * kl_term
            stats.update(kl_stats)
        stats["policy/entropy_avg"] = masked_mean(entropy.detach(), mb.response_mask)
        return loss, stats

    def next_ptx_batch(self):
        """This rank's next supervised batch (`input_ids`, `attention_mask`, `labels`, `[n, T]`)."""
        return self.ptx_dataset.get_collator()([self.ptx_dataset[i] for i in self.ptx_sampler.next_indices()])

    def update_losses(self, num_tokens, num_seqs):
        """The losses of one optimiser step for `ModelPasses.backward_step`, normalised by the
        step's global `num_tokens` / `num_seqs`."""
        return UpdateLosses(
            actor=lambda mb, forward: self.actor_loss(mb, num_tokens, num_seqs, forward),
            critic=(lambda mb, forward: self.critic_loss(mb, num_tokens, num_seqs, forward)) if self.critic is not None else None,
            cost_critic=((lambda mb, forward: self.cost_critic_loss(mb, num_tokens, num_seqs, forward))
                         if self.cost_critic is not None else None),
            next_ptx_batch=self.next_ptx_batch if self.ptx_sampler is not None else None,
            ptx_coeff=self.args.ptx_coeff,
        )

    def critic_loss(self, mb, num_tokens, num_seqs, forward=None):
        """The clipped value loss and its stats; `forward`: `{"values": [n, Tr]}` as the passes
        computed them; None runs the trained critic here."""
        values = response_values(self.critic, mb) if forward is None else forward["values"]
        return value_loss(values, mb.values, mb.returns, mb.response_mask, self.args.clip_range_value,
                          **self._agg(num_tokens, num_seqs))

    def optimizer_step(self, optimizer, model, loss_value, name):
        """Step unless the loss or a gradient is non-finite; returns None when stepped, else
        what was non-finite. The norm and the check see the gradients after the optimizer's
        own data-parallel / sharding sync (`grad_sync.prepare_step`), so all ranks agree."""
        where = " (on this or another rank)" if self.world_size > 1 else ""
        bad = None if self.all_ranks_finite(loss_value) else f"loss of the {name}{where}"
        self.grad_norms.pop(name, None)
        prepared = prepare_step(model, optimizer)
        # collective (model-parallel / sharding groups): every rank computes it, even with nothing to count
        total = squared_grad_norm(prepared.params, model_parallel_group(), prepared.sharding_group, pipeline_group())
        if bad is None and not math.isfinite(total):  # one host sync; search names only when needed
            grads = [(f"{name} grad of {p.name}", p.grad) for p in prepared.params]
            bad = first_non_finite(grads) or f"{name} gradient slice on another tensor-parallel or sharding rank"
        elif bad is None and prepared.params:
            self.grad_norms[name] = math.sqrt(total)
        if bad is None:
            prepared.step()
        optimizer.clear_grad(set_to_zero=not self.args.release_gradients)  # release_grads: free, not zero
        return bad

    def all_ranks_finite(self, value):
        """Whether `value` is finite on every rank (one all-reduce when there are several)."""
        finite = math.isfinite(value)
        if self.world_size > 1:
            flag = paddle.to_tensor([0.0 if finite else 1.0], dtype="float32")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            finite = float(flag) == 0.0
        return finite

    def update(self, exp, acc):
        """Train the actor (and critic) on a complete experience, their weights and optimizer
        states on the device for the duration (see `offload_level`)."""
        exp.require("complete")
        with self.offload.scope("actor", "critic", "cost_critic", with_optimizer=True):
            self._update_epochs(exp, acc)

    def _update_epochs(self, exp, acc):
        """`update_iters` passes over `exp` in optimiser steps of `grad_accum` micro-batches."""
        response_mask = exp.response_mask.numpy()  # one host copy for all token counts
        for epoch in range(self.args.update_iters):
            for plan in self.minibatch_plan(len(exp), epoch):
                self.update_on_plan(exp, plan, response_mask, acc)

    def update_on_plan(self, exp, plan, response_mask, acc):
        """One optimiser step of the actor (and critic) over `plan`'s micro-batches of `exp`:
        gradients from the passes, the steps, the divergence watch and the non-finite check."""
        mask = response_mask[[r for mb in plan for r in mb]]
        num_tokens = self.global_count(mask.sum())
        num_seqs = self.global_count((mask.sum(-1) > 0).sum())
        losses = self.update_losses(num_tokens, num_seqs)
        actor_total, value_totals, micro_stats = self.passes.backward_step(exp, plan, losses)
        for stats in micro_stats:
            acc.add(stats)
        bad = self.optimizer_step(self.actor_optimizer, self.actor, actor_total, "actor")
        if self.critic is not None:
            bad = bad or self.optimizer_step(self.critic_optimizer, self.critic, value_totals["critic"], "critic")
        if self.cost_critic is not None:
            bad = bad or self.optimizer_step(self.cost_critic_optimizer, self.cost_critic, value_totals["cost_critic"], "cost_critic")
        judged = {f"train/{name}_grad_norm": norm for name, norm in self.grad_norms.items()}
        acc.add(judged)
        judged["loss/policy_avg"] = actor_total
        if "policy/approxkl_avg" in micro_stats[-1]:  # the last micro-batch's KL(old || current policy)
            judged["policy/approxkl_avg"] = float(micro_stats[-1]["policy/approxkl_avg"])
        if self.critic is not None:
            judged["loss/value_avg"] = value_totals["critic"]
        if self.cost_critic is not None:
            judged["loss/cost_value_avg"] = value_totals["cost_critic"]
        for name, message in self.divergence.check(self.step + 1, judged).items():  # every optimiser step
            self.diverged.setdefault(name, message)
        self.handle_non_finite(bad, acc)

    def handle_non_finite(self, bad, acc):
        """Count a skipped update (`bad`: what was non-finite, None when the step was taken);
        raise NonFiniteError after more than `max_nan_skips` in a row."""
        if bad is None:
            self.nan_streak = 0
            acc.add({"train/nan_skipped_updates": 0.0})
            return
        self.nan_streak += 1
        acc.add({"train/nan_skipped_updates": 1.0})
        logger.warning(f"step {self.step + 1}: skipped an update, non-finite {bad}")
        if self.nan_streak > self.args.max_nan_skips:
            raise NonFiniteError(
                f"step {self.step + 1}: {self.nan_streak} consecutive updates had non-finite values "
                f"(last: {bad}); stopping. Lower the learning rate, check the reward scale, or clip scores."
            )

