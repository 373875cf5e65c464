"""Online (iterative) DPO: the preference pairs come from the policy itself, every round.

One round (`train_step`), as TRL's `OnlineDPOTrainer` and the iterative DPO of
Xiong et al. 2024 ("Iterative Preference Learning from Human Feedback"):
  1. rollout: `per_device_prompt_batch_size` prompts x `rollout_n` sampled answers
     (the PPO rollout engine, `experience_from_rollout`);
  2. score: reward model, reward server or rule scorers (`AnswerScorer`);
  3. pairs: best vs worst of each prompt, or every pair above `pair_margin`
     (`build_pairs`); prompts whose answers all score alike are skipped and counted;
  4. reference log-probs of every pair, once, without gradients (a frozen copy, or a
     LoRA policy with its adapter off);
  5. update: `update_iters` passes of shuffled pair micro-batches through the DPO-family
     loss (`preference_loss`), plus `sft_loss_ratio` x NLL of the chosen answers;
  6. every `ref_update_rounds` rounds the reference becomes a copy of the policy.
DPO log-probs are the policy's own (temperature 1): the implicit reward is defined on it.
"""
import json
import logging
import os
import time

import numpy as np
import paddle
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ppo.algos import dpo_loss
from ppo.algos.preference import PAIR_LOSS_TYPES, pair_loss
from ppo.checkpoint import list_checkpoints, load_checkpoint, prepare_output_dir, save_checkpoint, save_final_models
from ppo.common.console_report import closing_summary, evaluation_table, output_paths, step_line
from ppo.common.metrics import MetricAccumulator
from ppo.common.tracking import RunTracker, keep_rows_up_to
from ppo.evaluation import decode_responses, evaluate_generation
from ppo.experience import Experience, experience_from_rollout, in_chunks, response_logprobs
from ppo.optim import build_optimizer, build_scheduler
from ppo.prompt_sampler import PromptSampler
from ppo.rollout import RolloutEngine, SamplingParams

from .online_pairs import build_pairs, pair_batches

logger = logging.getLogger("dpo.online")

STEP_LINE_METRICS = ("objective/scores", "online_dpo/num_pairs", "online_dpo/score_gap", "loss/total", "loss/dpo",
                     "loss/sft", "rewards/accuracies", "rewards/margins", "lr", "response_length/mean", "timing_s/step")
"""The metrics of a round's console line (`console_report.step_line`)."""


def preference_loss(args, policy_logps, ref_logps, lengths, chosen_nll):
    """The configured DPO-family loss of P pairs: `(loss, stats)`.

    `policy_logps`, `ref_logps` (None without a reference), `lengths`: `[2P]` summed answer
    log-probs and answer lengths, chosen rows first; `chosen_nll`: token-mean NLL of the
    chosen answers (ORPO's own term). The one place that maps `loss_type` to a loss.
    """
    P = policy_logps.shape[0] // 2
    ref_c, ref_r = (None, None) if ref_logps is None else (ref_logps[:P], ref_logps[P:])
    if args.loss_type in PAIR_LOSS_TYPES:
        return pair_loss(policy_logps[:P], policy_logps[P:], ref_c, ref_r, beta=args.beta, loss_type=args.loss_type,
                         dpop_lambda=args.dpop_lambda)
    return dpo_loss(
        policy_logps[:P], policy_logps[P:], ref_c, ref_r, beta=args.beta, loss_type=args.loss_type,
        label_smoothing=args.label_smoothing, simpo_gamma=args.simpo_gamma, chosen_lengths=lengths[:P],
        rejected_lengths=lengths[P:], policy_chosen_nll=chosen_nll if args.loss_type == "orpo" else None,
    )


def sequence_logps(model, exp, chunk_size):
    """Summed answer log-probs `[N]` of `exp` under `model` (temperature 1)."""
    return response_logprobs(model, exp, 1.0, chunk_size)[0].sum(axis=-1)


class OnlineDPOTrainer:
    """`models`: a `PPOModels` (actor = policy; reference None for a LoRA policy, whose adapter is
    switched off instead); `scorer`: an `AnswerScorer`; datasets: `PromptOnlyDataset`s."""

    def __init__(self, args, models, tokenizer, scorer, train_dataset, eval_dataset=None, eval_long_answer_len=5):
        if paddle.distributed.get_world_size() > 1:
            raise ValueError("online DPO runs on one process; launch it without paddle.distributed.launch")
        self.args, self.models, self.tokenizer, self.scorer = args, models, tokenizer, scorer
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.eval_long_answer_len = eval_long_answer_len
        if args.ref_update_rounds and models.reference is None:
            raise ValueError("ref_update_rounds: a LoRA policy's reference is the base model with the adapter off and "
                             "cannot be refreshed; train without LoRA or set ref_update_rounds 0")
        self.policy = models.actor
        self.step = self.episodes = 0
        self.scheduler = build_scheduler(args.lr_scheduler_type, args.learning_rate, args.min_learning_rate,
                                         args.warmup_ratio, args.warmup_steps, args.max_steps)
        self.optimizer = build_optimizer(self.policy, self.scheduler, args.weight_decay, args.max_grad_norm, args.adam_beta1,
                                         args.adam_beta2, args.adam_epsilon, fused=args.use_fused_adamw)
        self.engine = RolloutEngine(self.policy, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                    use_rollout_engine=args.use_fusemt, kernels=args.rollout_kernels)
        self.sampling = SamplingParams(max_new_tokens=args.max_dec_len, min_new_tokens=args.min_dec_len,
                                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                       repetition_penalty=args.repetition_penalty, do_sample=True)
        self.sampler = PromptSampler(len(train_dataset), args.per_device_prompt_batch_size, seed=args.seed,
                                     shuffle=args.dataloader_shuffle)
        self.collate_prompts = train_dataset.get_collator()
        self.tracker = None

    # ------------------------------------------------------------------ 1.-3. rollout, scores, pairs
    def rollout(self):
        """`rollout_n` sampled answers to each of the round's prompts, as an `Experience`."""
        k = self.args.rollout_n
        batch = self.collate_prompts([self.train_dataset[i] for i in self.sampler.next_indices()])
        ids = paddle.repeat_interleave(batch["input_ids"], k, axis=0)
        mask = paddle.repeat_interleave(batch["attention_mask"], k, axis=0)
        out = self.engine.generate(ids, mask, self.sampling, seed=self.args.seed + 1_000_003 * self.step)
        return experience_from_rollout(batch, out, self.tokenizer.eos_token_id, repeat=k, group_base=self.step * len(batch["src"]))

    # ------------------------------------------------------------------ 4.-5. reference, update
    def reference_logps(self, both):
        """Reference log-probs `[2P]` of the stacked pairs (None when the loss uses none)."""
        if not self.args.uses_reference:
            return None
        with paddle.no_grad(), self.models.reference_mode() as ref:
            return in_chunks(lambda e: sequence_logps(ref, e, self.args.logprob_chunk_size), both, self._chunk())

    def _chunk(self):
        return max(self.args.per_device_eval_batch_size, self.args.per_device_train_batch_size)

    def micro_batch_loss(self, chosen, rejected, ref_logps, rows):
        """`(loss, stats)` of the pairs `rows`: preference loss x `pref_loss_ratio` + `sft_loss_ratio` x NLL."""
        args = self.args
        both = Experience.concat([chosen.select(rows), rejected.select(rows)])
        logps = sequence_logps(self.policy, both, args.logprob_chunk_size)
        lengths = both.response_mask.sum(axis=-1)
        P = len(rows)
        nll = -logps[:P].sum() / paddle.clip(lengths[:P].sum(), min=1.0)
        ref = None
        if ref_logps is not None:
            index = paddle.to_tensor(np.concatenate([rows, np.asarray(rows) + len(chosen)]).astype("int64"))
            ref = paddle.gather(ref_logps, index)
        loss, stats = preference_loss(args, logps, ref, lengths, nll)
        stats["loss/dpo"] = loss.detach()
        loss = args.pref_loss_ratio * loss
        if args.sft_loss_ratio:
            loss = loss + args.sft_loss_ratio * nll
            stats["loss/sft"] = nll.detach()
        stats["logps/chosen"] = logps[:P].detach().mean()
        stats["logps/rejected"] = logps[P:].detach().mean()
        return loss, stats

    def update(self, chosen, rejected, ref_logps, acc):
        """`update_iters` passes over the pairs in optimiser steps of `gradient_accumulation_steps`
        micro-batches; each step's loss is the mean over its pairs."""
        args = self.args
        self.policy.train()
        for epoch in range(args.update_iters):
            seed = args.seed + 10007 * self.step + 101 * epoch
            for plan in pair_batches(len(chosen), args.per_device_train_batch_size, args.gradient_accumulation_steps, seed):
                step_pairs = sum(len(rows) for rows in plan)
                total = 0.0
                for rows in plan:
                    loss, stats = self.micro_batch_loss(chosen, rejected, ref_logps, rows)
                    scaled = loss * (len(rows) / step_pairs)
                    scaled.backward()
                    total += float(scaled)
                    acc.add(stats)
                if not np.isfinite(total):
                    raise FloatingPointError(f"round {self.step + 1}: the online DPO loss is {total}; lower the learning rate")
                self.optimizer.step()
                self.optimizer.clear_grad()
                acc.add({"loss/total": total})
        self.policy.eval()

    def refresh_reference(self):
        """Copy the policy's weights into the reference (iterative DPO)."""
        self.models.reference.set_state_dict(self.policy.state_dict())

    # ------------------------------------------------------------------ one round
    def train_step(self):
        """One round; returns `(metrics, exp, pairs)`."""
        t0 = time.time()
        self.policy.eval()
        exp = self.rollout()
        t_rollout = time.time()
        scores = self.scorer.scores(exp)
        answers = [tuple(row) for row in (exp.response_ids * exp.response_mask.astype("int64")).numpy().tolist()]
        pairs = build_pairs(scores, self.args.rollout_n, self.args.pair_selection, self.args.pair_margin, answers)
        t_score = time.time()
        acc = MetricAccumulator()
        if len(pairs):
            chosen, rejected = exp.select(pairs.chosen.tolist()), exp.select(pairs.rejected.tolist())
            ref_logps = self.reference_logps(Experience.concat([chosen, rejected]))
            t_logprob = time.time()
            self.update(chosen, rejected, ref_logps, acc)
        else:
            t_logprob = time.time()
        self.scheduler.step()
        refreshed = bool(self.args.ref_update_rounds) and (self.step + 1) % self.args.ref_update_rounds == 0
        if refreshed:
            self.refresh_reference()
        t_end = time.time()
        self.episodes += len(exp)
        metrics = acc.local_result()
        metrics.update(self.round_metrics(exp, scores, pairs))
        metrics.update({"timing_s/rollout": t_rollout - t0, "timing_s/score": t_score - t_rollout,
                        "timing_s/logprob": t_logprob - t_score, "timing_s/update": t_end - t_logprob,
                        "timing_s/step": t_end - t0, "online_dpo/reference_refreshed": float(refreshed),
                        "lr": self.optimizer.get_lr(), "episode": float(self.episodes)})
        return metrics, exp, pairs

    def round_metrics(self, exp, scores, pairs):
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

    # ------------------------------------------------------------------ evaluation and traces
    def evaluate(self):
        """Greedy answers to the eval prompts: exact match (with reference answers) and mean score."""
        if self.eval_dataset is None:
            return {}
        labelled = all(self.eval_dataset[i]["label"] is not None for i in range(len(self.eval_dataset)))
        score_fn = None
        if labelled or not self.scorer.needs_labels:
            eos = self.tokenizer.eos_token_id
            score_fn = lambda batch, out: self.scorer.scores(experience_from_rollout(batch, out, eos)).tolist()  # noqa: E731
        metrics, _ = evaluate_generation(
            self.policy, self.tokenizer, self.eval_dataset, batch_size=self.args.per_device_eval_batch_size,
            max_new_tokens=self.args.eval_max_new_tokens or self.args.max_dec_len,
            long_answer_len=self.eval_long_answer_len, engine=self.engine, score_fn=score_fn,
        )
        metrics.pop("eval/num_samples", None)
        return metrics

    def log_pairs(self, exp, pairs, n=4):
        """Append up to `n` of the round's pairs to `samples.jsonl` (step, prompt, chosen, rejected)."""
        texts = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
        rows = [{"step": self.step, "prompt": exp.prompt_text[c], "chosen": texts[c], "rejected": texts[r]}
                for c, r in zip(pairs.chosen[:n].tolist(), pairs.rejected[:n].tolist())]
        with open(os.path.join(self.args.output_dir, "samples.jsonl"), "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_models(self):
        """Saved models: the policy, and the reference when rounds refresh it."""
        refreshed = self.models.reference if self.args.ref_update_rounds else None
        return {"policy": self.policy, "reference": refreshed}

    def save(self):
        keep_optimizer = not self.args.ignore_save_lr_and_optim
        state = {"step": self.step, "episodes": self.episodes, "sampler": self.sampler.state_dict(),
                 "optimizer_states": keep_optimizer}
        save_checkpoint(self.args.output_dir, self.step, self.checkpoint_models(),
                        {"policy": self.optimizer} if keep_optimizer else {}, {"policy": self.scheduler}, state,
                        self.tokenizer, self.args.save_total_limit)

    def maybe_resume(self):
        """Resume from `resume_from_checkpoint` or the newest complete checkpoint in `output_dir`,
        unless `overwrite_output_dir` starts afresh (clearing the old run's checkpoints)."""
        fresh = self.args.overwrite_output_dir and not self.args.resume_from_checkpoint
        prepare_output_dir(self.args.output_dir, fresh)
        found = list_checkpoints(self.args.output_dir)
        path = self.args.resume_from_checkpoint or (found[-1][1] if found and not fresh else None)
        if path is None:
            return False
        state = load_checkpoint(path, self.checkpoint_models(), {"policy": self.optimizer}, {"policy": self.scheduler})
        self.step, self.episodes = state["step"], state["episodes"]
        self.sampler.set_state_dict(state["sampler"])
        logger.info(f"resumed from {path} at round {self.step}")
        return True

    def log_evaluation(self):
        metrics = self.evaluate()
        self.tracker.log(metrics, step=self.step)
        logger.info(evaluation_table(self.step, metrics))

    def closing_text(self, summary):
        """The lines that end the run: what it reached and where its outputs are."""
        paths = output_paths(self.args.output_dir, self.args.logging_dir, self.args.report_to, [("policy model", "policy")])
        return closing_summary("online DPO finished", summary, paths)

    # ------------------------------------------------------------------ loop
    def train(self):
        """Run `max_steps` rounds; returns the summary written to `summary.json`."""
        args = self.args
        resumed = self.maybe_resume()
        self.tracker = RunTracker(args.output_dir, args.logging_dir, use_visualdl="visualdl" in args.report_to,
                                  resume=resumed, run_name=args.run_name)
        if resumed:
            self.tracker.truncate_after(self.step)
        keep_rows_up_to(os.path.join(args.output_dir, "samples.jsonl"), self.step)
        if args.evaluates and self.step == 0:
            self.log_evaluation()
        bar = tqdm(total=args.max_steps, initial=self.step, desc="online_dpo", disable=args.disable_tqdm)
        start = time.time()
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            while self.step < args.max_steps:
                metrics, exp, pairs = self.train_step()
                self.step += 1
                bar.update(1)
                bar.set_postfix(score=f"{metrics['objective/scores']:.3f}", pairs=int(metrics["online_dpo/num_pairs"]))
                if self.step % args.logging_steps == 0 or self.step == args.max_steps:
                    self.tracker.log(metrics, step=self.step)
                    logger.info(step_line(self.step, args.max_steps, metrics, STEP_LINE_METRICS))
                if args.num_sample_generations and self.step % args.num_sample_generations == 0 and len(pairs):
                    self.log_pairs(exp, pairs)
                if args.evaluates and (self.step % args.eval_steps == 0 or self.step == args.max_steps):
                    self.log_evaluation()
                if args.saves_checkpoints and args.save_steps and self.step % args.save_steps == 0 and self.step != args.max_steps:
                    self.save()
        bar.close()
        if args.saves_checkpoints:
            self.save()
        else:
            save_final_models(args.output_dir, {"policy": self.policy}, self.tokenizer)
        return self.tracker.finish(steps=self.step, train_wall_s=time.time() - start)
