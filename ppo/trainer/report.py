"""What the online loop writes for people and machines: `metrics.jsonl` and the dashboards
(`ppo.common.tracking.RunTracker`), one console line per logging step, the evaluation table,
`samples.jsonl` rows the learner picks (PPO: responses with their scores; online DPO: pairs),
and the closing summary naming every output."""
import logging
import os

from ..common.console_report import STEP_LINE_METRICS, closing_summary, evaluation_table, output_paths, step_line
from ..common.jsonl_trace import append_rows
from ..common.tracking import RunTracker, keep_rows_up_to
from ..evaluation import decode_responses

logger = logging.getLogger("ppo")


class RunReport:
    """`settings`: `LoopSettings`; `is_main`: whether this rank writes; `label`: the run's name
    (ppo, grpo, ppo-lagrangian, online DPO, ...); `step_metrics`: the names of the console line."""

    def __init__(self, settings, is_main, label, step_metrics=STEP_LINE_METRICS):
        self.settings, self.is_main, self.label, self.step_metrics = settings, is_main, label, step_metrics
        self.tracker = None

    def start(self, step, resumed):
        """Open the run's traces at `step` (a resumed run's later rows are dropped)."""
        s = self.settings
        self.tracker = RunTracker(s.output_dir, s.logging_dir, report_to=s.report_to, enabled=self.is_main, resume=resumed,
                                  run_name=s.run_name)
        if resumed:
            self.tracker.truncate_after(step)
        if self.is_main:  # samples of steps after the checkpoint are logged again
            keep_rows_up_to(os.path.join(s.output_dir, "samples.jsonl"), step)

    def log_step(self, step, total, metrics, diverged):
        """Every `logging_steps` (and the first with `logging_first_step`, the last, a diverged one):
        the step's metrics to `metrics.jsonl` / dashboards and one line to the console."""
        s = self.settings
        first = s.logging_first_step and step == 1
        if step % s.logging_steps == 0 or step == total or diverged or first:
            self.tracker.log(metrics, step=step)
            if self.is_main:
                logger.info(step_line(step, total, metrics, self.step_metrics))

    def log_evaluation(self, step, metrics):
        """The evaluation's metrics at `step`, and their table on the console."""
        self.tracker.log(metrics, step=step)
        if self.is_main:
            logger.info(evaluation_table(step, metrics))

    def log_samples(self, step, rows, table=None):
        """`rows` (dicts) appended to `samples.jsonl` with the step; `table` to the console."""
        if not self.is_main or not rows:
            return
        append_rows(os.path.join(self.settings.output_dir, "samples.jsonl"), [{"step": step, **row} for row in rows])
        if table:
            logger.info(f"step {step} samples (score | prompt -> response):\n{table}")

    def finish(self, **summary):
        """Write `summary.json`; returns the summary."""
        return self.tracker.finish(**summary)

    def closing_text(self, summary, model_folders):
        """The lines that end the run: what it reached and where its models (`model_folders`),
        checkpoint, metrics.jsonl, summary.json and dashboards are."""
        s = self.settings
        paths = output_paths(s.output_dir, s.logging_dir, s.report_to, [(f"{name} model", name) for name in model_folders])
        return closing_summary(f"{self.label} finished", summary, paths)


class ResponseSamples:
    """`samples.jsonl` rows of a PPO-family step: the first `n` groups' prompts and responses with
    every objective's score (`objectives`: `ScoredObjective`s) and group id; the first `n` rows
    also go to the console."""

    def __init__(self, tokenizer, objectives, group_size, n=4, token_details=False):
        self.tokenizer, self.objectives, self.group_size, self.n = tokenizer, list(objectives), group_size, n
        self.token_details = token_details

    def __call__(self, exp):
        """`(rows, console table)` of `exp`."""
        responses = (exp.response_text if exp.response_text is not None
                     else decode_responses(self.tokenizer, exp.response_ids, exp.response_mask))
        scores = {o.sample_key: exp.objectives[o.name].scores.numpy() for o in self.objectives}
        rows = [{"prompt": exp.prompt_text[i], "response": responses[i], "score": float(scores["score"][i]),
                 "group_id": int(exp.group_ids.numpy()[i]),
                 **{key: float(values[i]) for key, values in scores.items() if key != "score"},
                 **({"turns": exp.turns[i]} if exp.turns is not None else {})}  # a trajectory's turns with roles
                for i in range(min(self.n * max(1, self.group_size), len(exp)))]
        if self.token_details:
            for row, details in zip(rows, token_details(exp, len(rows))):
                row.update(details)
        table = "\n".join(f"  {r['score']:+.3f} | {r['prompt']!r} -> {r['response']!r}" for r in rows[: self.n])
        return rows, table


def token_details(exp, n):
    """`sample_token_details`: the first `n` rows of `exp` as ids and per-token lists, pads cut:
    `prompt_ids`, `response_ids` (every real response token, the environment's included),
    `policy_mask` (the loss mask: 1 on the policy's own tokens), `sampling_logprobs` (the
    engine's log-prob of each token, 0 off the policy's; `logprobs_of` "engine", or
    "old_logprobs" where the run keeps them as the old log-probs only: the engine's when reused);
    with a partial rollout `token_versions` (the weights version of each token) and, with the rollout
    correction on, `rollout_is_weights` (each token's weight)."""
    Tp = exp.prompt_len
    attention = exp.attention_mask.numpy()
    sequences, mask = exp.sequences.numpy(), exp.response_mask.numpy()
    engine = exp.rollout_logprobs if exp.rollout_logprobs is not None else exp.old_logprobs  # the engine's when reused
    logprobs = engine.numpy() if engine is not None else None
    out = []
    for i in range(n):
        real = attention[i, Tp:]
        end = int(real.nonzero()[0].max()) + 1 if real.any() else 0
        row = {"prompt_ids": sequences[i, :Tp][attention[i, :Tp] == 1].tolist(),
               "response_ids": sequences[i, Tp: Tp + end].tolist(),
               "policy_mask": mask[i, :end].astype(int).tolist()}
        if logprobs is not None:
            row["sampling_logprobs"] = [round(float(x), 6) for x in logprobs[i, :end]]
            row["logprobs_of"] = "engine" if exp.rollout_logprobs is not None else "old_logprobs"
        for name in ("token_versions", "rollout_is_weights"):
            if getattr(exp, name) is not None:
                values = getattr(exp, name).numpy()[i, :end]
                row[name] = values.tolist() if name == "token_versions" else [round(float(x), 6) for x in values]
        out.append(row)
    return out
