"""The online loop of PPO, GRPO, RLOO, REINFORCE++ and online DPO: it only orchestrates.

One step (`OnlineLoop.train_step`), as OpenRLHF's `train_step`:
  1.-4. the experience maker draws a rollout, scores it and (PPO family) completes it with
        log-probs, values, rewards and advantages (`ppo.trainer.experience_maker`);
  5.    the learner trains on it: the PPO-family updater (`ppo.trainer.updater`) or online
        DPO's pair learner (`dpo.online_learner`);
  6.    the metrics are reduced across ranks in one place.
Around the steps (`train`): logging, samples, evaluation, checkpoints and the stops (divergence,
a signal, the reward server gone, `early_stopping` on the evaluation metric), the best evaluated
policy, the final save and the summary.
The loop never branches on the algorithm or the parallel strategy: the parts it is given do."""
import json
import logging
import os
import time

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..common.console_report import number
from ..common.divergence import DivergenceError
from ..common.metrics import MetricAccumulator
from ..common.rank_faults import lost_rank_error
from ..common.run_guard import FlatRewardWatch, RolloutRankLost, RunInterrupted, interrupted_message, stop_requests
from ..serving.reward_client import RewardServerError
from .agent_rollout import ToolPoolError

logger = logging.getLogger("ppo")


class StepClock:
    """Wall times of a step's phases: `lap(name)` closes the phase `name` (`timing_s/<name>`);
    `tokens` given with a lap count the tokens that phase produced (`perf/tokens_per_s`)."""

    def __init__(self):
        self.start = self.last = time.time()
        self.laps, self.tokens = {}, None

    def lap(self, name, tokens=None):
        now = time.time()
        self.laps[name] = now - self.last
        self.last = now
        if tokens is not None:
            self.tokens, self.token_phase = tokens, name

    def metrics(self, episodes):
        """`timing_s/*`, `perf/tokens_per_s` and `perf/episodes_per_s` of the step so far."""
        total = time.time() - self.start
        out = {f"timing_s/{name}": seconds for name, seconds in self.laps.items()}
        out["timing_s/step"] = total
        if self.tokens is not None:
            out["perf/tokens_per_s"] = self.tokens / max(self.laps[self.token_phase], 1e-9)
        out["perf/episodes_per_s"] = episodes / max(total, 1e-9)
        return out


class OnlineLoop:
    """`experience`: an `ExperienceMaker`; `learner`: a `PPOUpdater` or online DPO's learner;
    `state`: the `RunState`; `report`: the `RunReport`; `evaluator`: an `Evaluator`; `watch`:
    the `DivergenceWatch`; `strategy`: the run's strategy (`ranks`, `fingerprint`); `settings`:
    `LoopSettings`; `max_steps`: the run's steps; `actor`: the unwrapped actor (fingerprints, the
    best policy); `passes`: the step's passes; `offload`: the `OffloadPlan`; `best_policy`: a
    `BestPolicy` with `load_best_model_at_end`, else None; `early_stop`: an `EvalEarlyStop` with
    `early_stopping`, else None."""

    def __init__(self, experience, learner, state, report, evaluator, watch, *, strategy, settings, max_steps, actor, passes,
                 offload, best_policy=None, early_stop=None):
        self.experience, self.learner, self.state, self.report = experience, learner, state, report
        self.evaluator, self.watch, self.strategy, self.settings = evaluator, watch, strategy, settings
        self.max_steps, self.actor, self.passes, self.offload, self.best_policy = max_steps, actor, passes, offload, best_policy
        self.early_stop = early_stop
        self.ranks = strategy.ranks
        self.flat_rewards = FlatRewardWatch()

    def train_step(self):
        """One step; returns `(metrics reduced across ranks, the experience)`."""
        clock, acc = StepClock(), MetricAccumulator()
        exp, stats = self.experience.make(clock)  # 1.-4. rollout, scores (, log-probs, values, advantages)
        acc.add(stats)
        self.learner.learn(exp, acc, clock)  # 5. the learner's optimiser steps
        self.state.episodes += len(exp) * self.ranks.data_world
        local = {**acc.local_result(), **clock.metrics(len(exp))}
        metrics = self.ranks.reduce_metrics(local)  # 6. one reduction across ranks
        metrics["lr"] = self.learner.lr()
        metrics["episode"] = float(self.state.episodes)
        return metrics, exp

    def train(self):
        """Run the loop; a SIGTERM / SIGINT saves at the next step boundary (`ppo.common.run_guard`).
        Returns the summary written to `summary.json`."""
        with stop_requests() as self.stop_request:
            resumed = self.state.resume()
            done = self.finished_run() if resumed else None
            if done is not None:
                return done
            self.report.start(self.state.step, resumed)
            if self.settings.evaluates and self.state.step == 0 and self.evaluator.dataset is not None:
                self.log_evaluation()
            start = time.time()
            try:
                self.run_steps()
                return self.finish(time.time() - start)
            except RuntimeError as err:  # a collective with a rank that died (split: it is named)
                self.stop_on_lost_rank(err)

    def run_steps(self):
        """The steps, each followed by its logging, samples, evaluation, checkpoint and stops."""
        s, state = self.settings, self.state
        bar = tqdm(total=self.max_steps, initial=state.step, desc=self.report.label,
                   disable=not self.ranks.is_main or s.disable_tqdm)
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            while state.step < self.max_steps:
                try:
                    metrics, exp = self.train_step()
                except RewardServerError as err:  # the server is gone for good (retries spent): keep the work
                    self.save_before_stopping(err, lambda note, e=err: RewardServerError(
                        f"{e}; {note}: run the same command again once the reward server is back", url=e.url,
                        attempts=e.attempts))
                except ToolPoolError as err:  # the tools fail on most rows, step after step: keep the work
                    self.save_before_stopping(err, lambda note, e=err: ToolPoolError(f"{e}; {note}"))
                except RolloutRankLost as err:  # a split run's rollout rank died: keep the work
                    self.save_before_stopping(err, lambda note, e=err: RolloutRankLost(
                        f"{e}; {note}: run the same command again to resume from it"))
                state.step += 1
                bar.update(1)
                bar.set_postfix({label: number(metrics[k]) for label, k in self.learner.progress_metrics.items() if k in metrics})
                diverged = self.watch.judge_step(state.step, metrics)
                self.flat_rewards.check(state.step, metrics)  # warns once (ppo.common.run_guard)
                self.report.log_step(state.step, self.max_steps, metrics, diverged)
                if diverged and s.stop_on_divergence:
                    self.stop_diverged(diverged)
                if s.num_sample_generations and state.step % s.num_sample_generations == 0:
                    self.report.log_samples(state.step, *self.learner.sample_rows(exp))
                if s.evaluates and self.evaluator.dataset is not None and (state.step % s.eval_steps == 0
                                                                           or state.step == self.max_steps):
                    if self.log_evaluation():  # early_stopping: finish() saves and says why
                        break
                if s.saves_checkpoints and s.save_steps and state.step % s.save_steps == 0 and state.step != self.max_steps:
                    state.save()
                if self.stop_request.should_stop(self.ranks.world_size):
                    self.stop_on_signal()
        bar.close()

    def finished_run(self):
        """After a resume: None when there is training left; for a finished run (it reached
        `max_steps`, or `early_stopping` stopped it) a warning that there is nothing to train and
        its summary, nothing changed. A run killed between its last checkpoint and `summary.json`
        completes its final save and summary here."""
        early = self.early_stop is not None and self.early_stop.stopped is not None
        if self.state.step < self.max_steps and not early:
            return None
        step, output_dir = self.state.step, self.settings.output_dir
        why = f"early_stopping stopped it at step {step}" if early else f"step {step} of max_steps={self.max_steps}"
        logger.warning(f"{output_dir} holds a finished run ({why}): nothing to train; overwrite_output_dir true "
                       "starts afresh")
        try:
            with open(os.path.join(output_dir, "summary.json")) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            summary = None
        if summary is None or summary.get("steps") != step:
            self.report.start(step, True)
            return self.finish(0.0)
        self.experience.close()
        return summary

    def finish(self, wall_s):
        """The final checkpoint (the last step's weights: a resume with a larger `max_steps` trains
        on from them), the best evaluated policy back in the actor and into `output_dir/policy`,
        the actor's fingerprints (a warning when the ranks disagree) and `summary.json`."""
        self.experience.close()
        if self.settings.saves_checkpoints:
            self.state.save()
        extra, restored = {}, None
        if self.best_policy is not None:
            with self.offload.scope("actor"):
                restored = self.best_policy.restore(self.actor)
            extra = self.best_policy.summary()
        if self.early_stop is not None:
            extra.update(self.early_stop.summary())
        if restored is not None or not self.settings.saves_checkpoints:  # save_strategy no: no checkpoint-<step>
            self.state.save_final_models("policy" if self.settings.saves_checkpoints else None)
        fingerprints = self.strategy.fingerprint(self.actor, self.passes)
        if len(set(fingerprints)) > 1:
            logger.warning(f"actor weights differ across ranks: {fingerprints}")
        if self.watch.log:
            extra["diverged"] = self.watch.log
        return self.report.finish(steps=self.state.step, train_wall_s=wall_s, actor_fingerprints=fingerprints, **extra)

    def log_evaluation(self):
        """Evaluate, log the metrics at this step and, with `load_best_model_at_end`, keep the
        actor's weights when they are the best evaluated so far. Returns whether `early_stopping`
        stops the run here (every evaluation counts for both, step 0's included:
        `ppo.trainer.best_policy`)."""
        metrics = self.evaluator.evaluate()
        self.report.log_evaluation(self.state.step, metrics)
        if self.best_policy is not None:
            with self.offload.scope("actor"):
                self.best_policy.consider(self.state.step, metrics, self.actor)
        return self.early_stop is not None and self.early_stop.observe(self.state.step, metrics)

    def stop_diverged(self, messages):
        """Write `summary.json` naming the divergence and raise DivergenceError; nothing is
        saved, so `output_dir/policy` and the checkpoints keep the last good weights."""
        from ..checkpoints.checkpoint import list_checkpoints

        kept = list_checkpoints(self.settings.output_dir)
        where = f"the last good checkpoint is {kept[-1][1]}" if kept else "no checkpoint was saved before it"
        self.report.finish(steps=self.state.step, diverged=self.watch.log)
        raise DivergenceError(f"stopped: {'; '.join(messages)}; {where} (stop_on_divergence=False lets the run go on)")

    def save_before_stopping(self, err, stopped):
        """Save a checkpoint of the last completed step (one process only, or every rank when `err`
        was raised on all of them at one point: `on_every_trainer`) and raise `stopped(note)`, the
        error again with a note saying where it is."""
        if (self.ranks.world_size > 1 and not getattr(err, "on_every_trainer", False)) or self.state.step == 0:
            raise err
        self.state.save()
        saved = os.path.join(self.settings.output_dir, f"checkpoint-{self.state.step}")
        raise stopped(f"saved {saved} (after step {self.state.step}) before stopping") from err

    def stop_on_lost_rank(self, err):
        """Raise `err`, or, when it is a collective's error in a split run one of whose ranks died
        (`ppo.common.rank_faults.lost_rank_error`), `TrainerRankLost` naming the ranks that are
        gone and the newest checkpoint on disk."""
        from ..checkpoints.checkpoint import list_checkpoints

        lost = lost_rank_error(err)
        if lost is None:
            raise err
        kept = list_checkpoints(self.settings.output_dir)
        where = f"the last checkpoint is {kept[-1][1]}" if kept else "no checkpoint was saved before it"
        raise type(lost)(f"{lost}; {where}: run the same command again to resume from it") from err

    def stop_on_signal(self):
        """Save a checkpoint at this step, write `summary.json` and raise RunInterrupted; in a split
        run whose rollout rank is gone (a launcher stops the trainer with SIGTERM when another
        rank died), RolloutRankLost naming it and the checkpoint instead (looked for before the
        save, while the launcher has yet to stop the other ranks)."""
        check, lost = getattr(self.experience, "check_peer", None), None
        try:
            if check is not None:
                check()
        except RolloutRankLost as err:
            lost = err
        self.state.save()
        saved = os.path.join(self.settings.output_dir, f"checkpoint-{self.state.step}")
        if lost is not None:
            raise RolloutRankLost(f"{lost}; stopped on {self.stop_request.signal_name} after it: saved {saved} (after step "
                                  f"{self.state.step}) before stopping: run the same command again to resume from it") from lost
        self.report.finish(steps=self.state.step, interrupted=self.stop_request.signal_name)
        raise RunInterrupted(interrupted_message(self.stop_request, self.state.step, saved), self.stop_request.signum)

    def closing_text(self, summary):
        """The lines that end the run (`RunReport.closing_text`)."""
        return self.report.closing_text(summary, [name for name, model in self.state.models.items() if model is not None])
