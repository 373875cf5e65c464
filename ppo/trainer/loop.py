"""The loop around PPO / GRPO steps: `train_step` (experience, update, metrics reduced across
ranks in one place), `train` (logging, samples, evaluation, checkpoints, divergence stops),
`evaluate`, `save` / `maybe_resume`, and the closing fingerprint of the actor's weights."""
import logging
import os
import time

import paddle
import paddle.distributed as dist
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..checkpoint import list_checkpoints, load_checkpoint, prepare_output_dir, save_checkpoint, save_final_models
from ..common.console_report import closing_summary, evaluation_table, number, output_paths, run_label, step_line
from ..common.divergence import DivergenceError
from ..common.metrics import MetricAccumulator, reduce_across_ranks
from ..common.jsonl_trace import append_rows
from ..common.resume_check import CheckpointMismatchError
from ..common.run_guard import FlatRewardWatch, RunInterrupted, interrupted_message, stop_requests
from ..common.tracking import RunTracker, keep_rows_up_to
from ..evaluation import decode_responses, evaluate_generation
from ..experience import experience_from_rollout
from ..models.tensor_parallel import model_parallel_group
from ..reward_client import RewardServerError
from ..sampled_eval import evaluate_sampled, sampled_eval_settings
from .best_policy import BestPolicy, eval_metric_name

logger = logging.getLogger("ppo")


class TrainingLoop:
    """The loop of `PPOTrainer`. Reads everything the trainer holds; keeps `step`, `episodes`,
    `tracker` and `divergence_log`."""

    # ------------------------------------------------------------------ one step
    def train_step(self):
        """One PPO / GRPO step; returns `(metrics reduced across ranks, the complete experience)`."""
        t_start = time.time()
        self.actor.eval()
        exp, draws = self.sample_with_dynamic_filter()  # 1.-2. rollout and scores (groups that vary)
        exp, balance_stats = self.balanced_across_ranks(exp)  # balance_batch: even token counts over data ranks
        t_rollout = time.time()
        stats = self.compute_advantages(exp)  # 3.-4. log-probs, values, shaped rewards, advantages
        t_logprob = time.time()
        acc = MetricAccumulator()
        acc.add({**stats, **balance_stats})
        self.actor.train()
        for critic in (self.critic, self.cost_critic):
            if critic is not None:
                critic.train()
        self.update(exp, acc)  # 5. optimiser steps of the actor (and critics)
        for scheduler in (self.actor_scheduler, self.critic_scheduler, self.cost_critic_scheduler):
            if scheduler is not None:
                scheduler.step()
        t_end = time.time()
        tokens = float(exp.response_mask.sum())
        self.episodes += len(exp) * self.data_world
        local = acc.local_result()
        local.update(
            {
                "timing_s/rollout": t_rollout - t_start,
                "timing_s/logprob": t_logprob - t_rollout,
                "timing_s/update": t_end - t_logprob,
                "timing_s/step": t_end - t_start,
                "perf/tokens_per_s": tokens / max(t_rollout - t_start, 1e-9),
                "perf/episodes_per_s": len(exp) / max(t_end - t_start, 1e-9),
                "rollout/gen_batches": float(draws),
            }
        )
        metrics = reduce_across_ranks(local)
        metrics["lr"] = self.actor_optimizer.get_lr()
        metrics["episode"] = float(self.episodes)
        return metrics, exp

    # ------------------------------------------------------------------ evaluation
    def evaluate(self):
        """Greedy responses to this rank's share of the eval prompts: mean score and, with
        reference answers, exact match; reduced across ranks."""
        if self.eval_dataset is None:
            return {}
        labelled = all(self.eval_dataset[i]["label"] is not None for i in range(len(self.eval_dataset)))
        score_fn = None
        if labelled or (self.reward_client is None and self.rule_scorer is None):
            score_fn = lambda batch, out: self.score(
                experience_from_rollout(batch, out, self.tokenizer.eos_token_id)
            ).numpy().tolist()
        self.actor.eval()
        with self.offload.scope("actor"), self.generation_weights() as model:
            metrics, _ = evaluate_generation(
                model, self.tokenizer, self.eval_dataset,
                batch_size=self.args.per_device_eval_batch_size,
                max_new_tokens=self.args.eval_max_new_tokens or self.args.max_dec_len,
                long_answer_len=self.eval_long_answer_len, engine=self.engine, score_fn=score_fn,
                indices=list(range(self.data_rank, len(self.eval_dataset), self.data_world)),
            )
            if self.args.eval_num_samples:  # eval/pass@k, eval/maj@n, eval/mean@n over sampled responses
                judge, params = sampled_eval_settings(self.args, self.sampling, self.rule_scorer)
                metrics.update(evaluate_sampled(
                    model, self.tokenizer, self.eval_dataset, judge, self.args.eval_num_samples, params,
                    batch_size=self.args.per_device_eval_batch_size, seed=self.args.seed, engine=self.engine,
                    indices=list(range(self.data_rank, len(self.eval_dataset), self.data_world)), prefix="eval/")[0])
        metrics.pop("eval/num_samples", None)
        return reduce_across_ranks(metrics)

    # ------------------------------------------------------------------ traces
    def log_samples(self, exp, n=4):
        responses = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
        rows = [
            {"step": self.step, "prompt": exp.prompt_text[i], "response": responses[i], "score": float(exp.scores.numpy()[i]),
             "group_id": int(exp.group_ids.numpy()[i]), **({"cost": float(exp.costs.numpy()[i])} if exp.costs is not None else {})}
            for i in range(min(n * max(1, self.args.rollout_n), len(exp)))
        ]
        append_rows(os.path.join(self.args.output_dir, "samples.jsonl"), rows)
        table = "\n".join(f"  {r['score']:+.3f} | {r['prompt']!r} -> {r['response']!r}" for r in rows[: n])
        logger.info(f"step {self.step} samples (score | prompt -> response):\n{table}")

    def trainer_state(self):
        return {
            "step": self.step,
            "episodes": self.episodes,
            "gen_batches": self.gen_batches,
            "sampler": self.sampler.state_dict(),
            "ptx_sampler": self.ptx_sampler.state_dict() if self.ptx_sampler else None,
            "reward_normalizer": self.reward_normalizer.state_dict() if self.reward_normalizer else None,
            "kl_controller": self.kl_controller.state_dict() if self.kl_controller else None,
            "divergence": self.divergence.state_dict(),
            "lagrange": self.lagrange.state_dict() if self.lagrange else None,  # PPO-Lagrangian's multiplier
            "run": self.run_facts(),  # compared on resume (ppo.common.resume_check)
        }

    def save(self):
        keep_optimizers = not self.args.ignore_save_lr_and_optim  # PaddleNLP: smaller checkpoints, fresh AdamW on resume
        save_checkpoint(
            self.args.output_dir, self.step, self._models_for_checkpoint(),
            self._optimizers_for_checkpoint() if keep_optimizers else {}, self._schedulers_for_checkpoint(),
            {**self.trainer_state(), "optimizer_states": keep_optimizers}, self.tokenizer, self.args.save_total_limit,
        )

    def maybe_resume(self):
        """Resume from the newest complete checkpoint in `output_dir` that loads (older ones are
        tried when it does not), unless overwrite_output_dir starts afresh (clearing the old run)."""
        fresh = self.args.overwrite_output_dir and not self.args.resume_from_checkpoint
        prepare_output_dir(self.args.output_dir, fresh)
        if fresh:
            return False
        found = [path for _, path in reversed(list_checkpoints(self.args.output_dir))]
        candidates = [self.args.resume_from_checkpoint] if self.args.resume_from_checkpoint else found
        state = None
        for i, path in enumerate(candidates):
            try:
                state = load_checkpoint(
                    path, self._models_for_checkpoint(), self._optimizers_for_checkpoint(), self._schedulers_for_checkpoint(),
                    self.run_facts(),
                )
                break
            except CheckpointMismatchError:  # another run's checkpoint: never fall back past it
                raise
            except Exception as err:  # a damaged checkpoint: fall back to the one before it
                if i == len(candidates) - 1:
                    raise
                logger.warning(f"cannot resume from {path} ({type(err).__name__}: {err}); trying {candidates[i + 1]}")
        if state is None:
            return False
        self.step, self.episodes, self.gen_batches = state["step"], state["episodes"], state["gen_batches"]
        self.sampler.set_state_dict(state["sampler"])
        if self.ptx_sampler and state.get("ptx_sampler"):
            self.ptx_sampler.set_state_dict(state["ptx_sampler"])
        if self.reward_normalizer and state.get("reward_normalizer"):
            self.reward_normalizer.set_state_dict(state["reward_normalizer"])
        if self.kl_controller and state.get("kl_controller"):
            self.kl_controller.set_state_dict(state["kl_controller"])
        self.divergence.set_state_dict(state.get("divergence"))
        if self.lagrange and state.get("lagrange"):
            self.lagrange.set_state_dict(state["lagrange"])
        logger.info(f"resumed from {path} at step {self.step}")
        return True

    # ------------------------------------------------------------------ loop
    def train(self):
        """Run the loop; a SIGTERM / SIGINT saves at the next step boundary (`ppo.common.run_guard`)."""
        self.flat_rewards = FlatRewardWatch()
        with stop_requests() as self.stop_request:
            return self.train_loop()

    def start_tracking(self):
        """Resume (`maybe_resume`), open the run's traces and the best-policy keeper."""
        args = self.args
        resumed = self.maybe_resume()
        self.tracker = RunTracker(args.output_dir, args.logging_dir, report_to=args.report_to,
                                  enabled=self.is_main, resume=resumed, run_name=args.run_name)
        if resumed:
            self.tracker.truncate_after(self.step)
        if self.is_main:  # samples of steps after the checkpoint are logged again
            keep_rows_up_to(os.path.join(args.output_dir, "samples.jsonl"), self.step)
        self.best_policy = None
        if args.load_best_model_at_end:  # PaddleNLP's names; checked in ppo.ppo_argument_checks
            self.best_policy = BestPolicy(eval_metric_name(args.metric_for_best_model), args.greater_is_better is not False)

    def train_loop(self):
        args = self.args
        self.start_tracking()
        if args.evaluates and self.step == 0 and self.eval_dataset is not None:
            self.log_evaluation()
        bar = tqdm(total=self.max_steps, initial=self.step, desc=self.run_label, disable=not self.is_main or args.disable_tqdm)
        start = time.time()
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            while self.step < self.max_steps:
                try:
                    metrics, exp = self.train_step()
                except RewardServerError as err:  # the server is gone for good (retries spent): keep the work
                    self.save_before_stopping(err)
                self.step += 1
                bar.update(1)
                bar.set_postfix(score=number(metrics["objective/scores"]), kl=number(metrics["objective/kl"]),
                                len=f"{metrics['response_length/mean']:.1f}")
                diverged = self.step_divergence(metrics)
                self.flat_rewards.check(self.step, metrics)  # warns once (ppo.common.run_guard)
                self.log_step(metrics, diverged)
                if diverged and args.stop_on_divergence:
                    return self.stop_diverged(diverged)
                if self.is_main and args.num_sample_generations and self.step % args.num_sample_generations == 0:
                    self.log_samples(exp)
                if args.evaluates and self.eval_dataset is not None and (self.step % args.eval_steps == 0 or self.step == self.max_steps):
                    self.log_evaluation()
                if args.saves_checkpoints and args.save_steps and self.step % args.save_steps == 0 and self.step != self.max_steps:
                    self.save()
                if self.stop_request.should_stop(self.world_size):
                    return self.stop_on_signal()
        bar.close()
        extra = self.restore_best_policy()
        if args.saves_checkpoints:
            self.save()
        else:  # save_strategy no: the final models only, no checkpoint-<step>
            save_final_models(args.output_dir, self._models_for_checkpoint(), self.tokenizer)
        fingerprints = self.actor_fingerprints()
        if len(set(fingerprints)) > 1:
            logger.warning(f"actor weights differ across ranks: {fingerprints}")
        if self.divergence_log:
            extra["diverged"] = self.divergence_log
        return self.tracker.finish(steps=self.step, train_wall_s=time.time() - start, actor_fingerprints=fingerprints, **extra)

    def closing_text(self, summary):
        """The lines that end the run (`console_report.closing_summary`): what it reached and where
        its models, checkpoint, metrics.jsonl, summary.json and VisualDL logs are."""
        models = [(f"{name} model", name) for name, model in self._models_for_checkpoint().items() if model is not None]
        paths = output_paths(self.args.output_dir, self.args.logging_dir, self.args.report_to, models)
        return closing_summary(f"{self.run_label} finished", summary, paths)

    def log_step(self, metrics, diverged):
        """Every `logging_steps` (and the first with `logging_first_step`, the last, a diverged one):
        the step's metrics to `metrics.jsonl` / VisualDL and one line to the console."""
        args = self.args
        first = args.logging_first_step and self.step == 1
        if self.step % args.logging_steps == 0 or self.step == self.max_steps or diverged or first:
            self.tracker.log(metrics, step=self.step)
            if self.is_main:
                logger.info(step_line(self.step, self.max_steps, metrics))

    @property
    def run_label(self):
        """ppo, grpo, rloo, ... (`console_report.run_label`): the progress bar's and summary's name."""
        return run_label(self.args.adv_estimator, self.lagrange is not None)

    def log_evaluation(self):
        """Evaluate, log the metrics at this step (and their table to the console) and, with
        `load_best_model_at_end`, keep the actor's weights when they are the best evaluated so far."""
        metrics = self.evaluate()
        self.tracker.log(metrics, step=self.step)
        if self.is_main:
            logger.info(evaluation_table(self.step, metrics))
        if self.best_policy is not None:
            with self.offload.scope("actor"):
                self.best_policy.consider(self.step, metrics, self.models.actor)

    def restore_best_policy(self):
        """Put the best evaluated weights back into the actor before the final save (with
        `load_best_model_at_end`); returns the summary's `best_policy` entry ({} without)."""
        if self.best_policy is None:
            return {}
        with self.offload.scope("actor"):
            self.best_policy.restore(self.models.actor)
        return self.best_policy.summary()

    def step_divergence(self, metrics):
        """This step's divergence messages (KL per step, gradient norms and losses per optimiser
        step), logged as warnings; every rank gets a non-empty list when any rank diverged."""
        self.diverged.update(self.divergence.check(self.step, {"objective/kl": metrics["objective/kl"]}))
        messages, self.diverged = list(self.diverged.values()), {}
        self.divergence_log += messages
        for message in messages:
            logger.warning(f"the run is diverging: {message}")
        if self.world_size > 1:
            flag = paddle.to_tensor([int(bool(messages))], dtype="int64")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if int(flag) and not messages:
                messages = [f"step {self.step}: a metric diverged on another rank"]
        return messages

    def stop_diverged(self, messages):
        """Write `summary.json` naming the divergence and raise DivergenceError; nothing is
        saved, so `output_dir/policy` and the checkpoints keep the last good weights."""
        kept = list_checkpoints(self.args.output_dir)
        where = f"the last good checkpoint is {kept[-1][1]}" if kept else "no checkpoint was saved before it"
        self.tracker.finish(steps=self.step, diverged=self.divergence_log)
        raise DivergenceError(f"stopped: {'; '.join(messages)}; {where} (stop_on_divergence=False lets the run go on)")

    def save_before_stopping(self, err):
        """Save a checkpoint of the last completed step (one process only: the ranks may not all have
        failed at one point) and raise RewardServerError saying where it is."""
        if self.world_size > 1 or self.step == 0:
            raise err
        self.save()
        saved = os.path.join(self.args.output_dir, f"checkpoint-{self.step}")
        raise RewardServerError(f"{err}; saved {saved} (after step {self.step}) before stopping: run the same command "
                                "again once the reward server is back", url=err.url, attempts=err.attempts) from err

    def stop_on_signal(self):
        """Save a checkpoint at this step, write `summary.json` and raise RunInterrupted."""
        self.save()
        saved = os.path.join(self.args.output_dir, f"checkpoint-{self.step}")
        self.tracker.finish(steps=self.step, interrupted=self.stop_request.signal_name)
        raise RunInterrupted(interrupted_message(self.stop_request, self.step, saved), self.stop_request.signum)

    def actor_fingerprints(self):
        """One number per rank summarising the (whole, merged) actor weights; equal on every rank
        when in sync, and between tensor-parallel degrees up to float rounding."""
        params = list(self.models.actor.parameters())
        value = sum(float((p.astype("float64") * (i + 1)).sum()) for i, p in enumerate(params) if not p.is_distributed)
        split = [float((p.astype("float64") * (i + 1)).sum()) for i, p in enumerate(params) if p.is_distributed]
        group = model_parallel_group()
        if split and group is not None:  # tensor-parallel slices add up to the whole weight's number
            t = paddle.to_tensor([sum(split)], dtype="float64")
            dist.all_reduce(t, group=group)
            value += float(t.numpy()[0])
        else:
            value += sum(split)
        value = self.passes.group_sum(value)  # pipeline stages hold other layers: their sum
        if self.world_size == 1:
            return [value]
        gathered = []
        dist.all_gather(gathered, paddle.to_tensor([value], dtype="float64"))
        return [float(t.numpy()[0]) for t in gathered]

