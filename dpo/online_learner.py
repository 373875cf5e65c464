"""Online (iterative) DPO's learner in the online loop (`ppo.trainer.loop.OnlineLoop`): the
experience maker hands it a scored rollout (`rollout_n` answers per prompt, as TRL's
`OnlineDPOTrainer` and the iterative DPO of Xiong et al. 2024), and one round is:
  3. pairs: best vs worst of each prompt, or every pair above `pair_margin`, by the scores
     (`build_pairs`) or by a generative judge's pairwise verdicts (`dpo.pair_choice`);
     prompts whose answers all score (or are judged) alike are skipped and counted;
  4. reference log-probs of every pair, once, without gradients (through the passes: a frozen
     copy, or a LoRA policy with its adapter off);
  5. update: `update_iters` passes of shuffled pair micro-batches through the passes'
     `backward_step`, the loss from the preference-loss registry
     (`dpo.preference_objective.preference_objective`: the DPO-family loss x `pref_loss_ratio` +
     `sft_loss_ratio` x NLL of the chosen answers), each optimiser step through the strategy
     (a non-finite step is skipped; too many in a row stop the run);
  6. every `ref_update_rounds` rounds the reference becomes a copy of the policy.
DPO log-probs are the policy's own (temperature 1): the implicit reward is defined on it."""
import numpy as np
import paddle

from ppo.evaluation import decode_responses
from ppo.experience.stages import Experience
from ppo.passes import UpdateLosses

from .online_pairs import pair_batches
from .pair_choice import ScoredPairs
from .preference_objective import preference_objective


class OnlineDPOLearner:
    """`policy`: the policy's `TrainedModel`; `models`: the `PPOModels` (the reference refreshed
    from the policy); `passes`: the `ModelPasses` (temperature 1); `steps`: the
    `OptimizerSteps`; `divergence`: the run's `DivergenceWatch`; `tokenizer`: for the pairs'
    samples; `state`: the `RunState`; `args`: online DPO's training arguments (the loss's
    settings, the pair selection, the update's batches); `choose_pairs`: `(exp, scores,
    answer_keys) -> (PreferencePairs, stats)` (`dpo.pair_choice`; default: by the scores)."""

    progress_metrics = {"score": "objective/scores", "pairs": "online_dpo/num_pairs"}
    """The progress bar's numbers: label -> metric."""

    def __init__(self, policy, models, passes, steps, *, divergence, tokenizer, state, args, choose_pairs=None):
        self.policy, self.models, self.passes, self.steps, self.divergence = policy, models, passes, steps, divergence
        self.tokenizer, self.state, self.args = tokenizer, state, args
        self.choose_pairs = choose_pairs or ScoredPairs(args)
        self.pairs = None  # the last round's pairs

    def lr(self):
        return self.policy.optimizer.get_lr()

    def learn(self, exp, acc, clock):
        """One round on a scored experience (see the module docstring); metrics go to `acc`."""
        args = self.args
        scores = exp.scores.numpy().astype("float64")
        answers = [tuple(row) for row in (exp.response_ids * exp.response_mask.astype("int64")).numpy().tolist()]
        pairs, pair_stats = self.choose_pairs(exp, scores, answers)
        self.pairs = pairs
        acc.add(pair_stats)
        clock.lap("pairs")
        if len(pairs):
            both = Experience.concat([exp.select(pairs.chosen.tolist()), exp.select(pairs.rejected.tolist())])
            self.fill_reference(both)
            clock.lap("logprob")
            self.update(both, len(pairs), acc)
        self.policy.scheduler.step()
        refreshed = bool(args.ref_update_rounds) and (self.state.step + 1) % args.ref_update_rounds == 0
        if refreshed:
            self.models.reference.set_state_dict(self.policy.model.state_dict())  # iterative DPO: the reference moves
        clock.lap("update")
        acc.add({**round_metrics(exp, scores, pairs), "online_dpo/reference_refreshed": float(refreshed)})

    def fill_reference(self, both):
        """`both.ref_logprobs` `[2P, Tr]`: the reference's log-probs of the stacked pairs (left
        None when the loss uses no reference)."""
        if self.args.uses_reference:
            with paddle.no_grad():
                both.ref_logprobs = self.passes.logprobs("reference", both)

    def update(self, both, num_pairs, acc):
        """`update_iters` passes over the pairs (`both`: chosen rows, then rejected rows) in
        optimiser steps of `gradient_accumulation_steps` micro-batches; each step's loss is the
        mean over its pairs."""
        args = self.args
        self.policy.model.train()
        for epoch in range(args.update_iters):
            seed = args.seed + 10007 * self.state.step + 101 * epoch
            for plan in pair_batches(num_pairs, args.per_device_train_batch_size, args.gradient_accumulation_steps, seed):
                rows = [list(mb) + [r + num_pairs for r in mb] for mb in plan]  # a micro-batch's chosen, then rejected rows
                total, _, micro_stats = self.passes.backward_step(both, rows, self.losses(sum(len(mb) for mb in plan)))
                for stats in micro_stats:
                    acc.add(stats)
                judged = dict(self.steps.step([self.policy], {self.policy.name: total}, acc))
                acc.add({"loss/total": total})
                self.divergence.judge_update(self.state.step + 1, {**judged, "loss/total": total})
        self.policy.model.eval()

    def losses(self, step_pairs):
        """The loss of one optimiser step's micro-batches (each its pairs' share of the step's mean)."""

        def pair_loss(mb, forward):
            logps = forward["logprobs"].sum(axis=-1)
            lengths = mb.response_mask.sum(axis=-1)
            ref = None if mb.ref_logprobs is None else mb.ref_logprobs.sum(axis=-1)
            loss, stats = preference_objective(self.args, logps, lengths, ref)
            return loss * (logps.shape[0] // 2 / step_pairs), stats

        return UpdateLosses(actor=pair_loss, with_entropy=False)

    def sample_rows(self, exp, n=4):
        """`samples.jsonl` rows of up to `n` of the round's pairs (prompt, chosen, rejected)."""
        pairs = self.pairs
        if pairs is None or not len(pairs):
            return [], None
        texts = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
        return [{"prompt": exp.prompt_text[c], "chosen": texts[c], "rejected": texts[r]}
                for c, r in zip(pairs.chosen[:n].tolist(), pairs.rejected[:n].tolist())], None


def round_metrics(exp, scores, pairs):
    """Scores, answer lengths and pair counts of one round."""
    lengths = exp.response_mask.sum(axis=-1).numpy()
    eos = exp.ends_with_eos.numpy()
    gaps = scores[pairs.chosen] - scores[pairs.rejected] if len(pairs) else np.zeros([1])
    return {
        "objective/scores": float(scores.mean()),
        "objective/scores_chosen": float(scores[pairs.chosen].mean()) if len(pairs) else float("nan"),
        "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()), "response_length/clip_ratio": float((~eos).mean()),
        "online_dpo/num_pairs": float(len(pairs)), "online_dpo/tied_groups_frac": pairs.tied_fraction,
        "online_dpo/score_gap": float(gaps.mean()), "online_dpo/duplicate_pairs": float(pairs.duplicate_pairs),
    }
