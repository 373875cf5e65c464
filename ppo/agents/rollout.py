"""Multi-turn rollouts that pause rows, not the batch.

    result = rollout_trajectories(engine, records, AgentSettings(env_name="tools", ...),
                                  TaggedFormat(tokenizer, "USER: {input} ASSISTANT:"),
                                  SamplingParams(max_new_tokens=64), seed=0)
    result.trajectories, result.metrics, result.stats

Every record gets its own environment (``env.reset(record)`` gives the prompt). Rows decode
together on the engine's kernels (ppo/rollout/multi_turn.py). A policy turn ends at a stop
token (EOS), at a stop string of the environment (``</tool_call>``) or of ``params`` (its
``stop_strings`` and ``stop_sequences``), or after ``params.max_new_tokens`` tokens;
``params.min_new_tokens`` applies per turn (stop tokens; stop strings end a turn at any length). A turn
that ended at a stop string is closed with the format's end-of-turn tokens (a chat template's
``<|im_end|>``: ``turn_format.turn_end_ids``) as the policy's own tokens, each with its log-prob
under the sampling distribution (as if sampled; no uniform drawn), so that the policy is trained
to end its turn after a call; a turn cut at ``max_new_tokens`` gets them as glue. The turn's
text (what the policy sampled) then goes to ``env.step`` in a worker thread (one per waiting row) while the other rows keep
decoding; when the answer is back its tokens (glue, answer, glue, from the format) are fed
onto that row's cache, chunk-prefilled (with the other answers that came back within
``feed_interval`` decode steps, in one pass over those rows), and the row samples again.

The episode ends when the environment says ``done``, after ``max_turns`` policy turns, when
the trajectory would pass ``max_total_len`` tokens (both ``truncated``), or when ``env.step``
raises ("env_error") or takes longer than ``settings.step_timeout_s`` ("env_timeout"), or when the
trajectory has run ``settings.trajectory_timeout_s`` seconds ("trajectory_timeout", truncated: a
turn being written is closed, a step being waited for is abandoned); nothing of one row stops
the others. An observation may be a list of messages (one per tool call of the turn), fed as
the format renders consecutive messages. The run's tool limits (``max_concurrent_tool_calls``,
``tool_timeout_s``) are set for the process when the rollout starts (ppo/agents/tool_limits.py). ``pause="batch"`` is the turn-synchronous baseline for comparison (a row
whose answer is back waits until no row is decoding or waiting, then all go on together).

Only our engine runs multi-turn rollouts; PaddleNLP's ``generate`` (``use_fusemt false``) has
no way to feed tokens onto a row's cache mid-generation and is refused by name.
"""
import queue
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Dict, List

from ..rollout.multi_turn import SlotDecoder
from ..rollout.weights import unwrap_model
from .arguments import AgentSettings
from .environment import environment_facts
from .formats import decode_exact
from .metrics import agent_metrics
from .record_env import build_environments, close_all, record_environment, record_role
from .tool_limits import set_tool_limits
from .trajectory import Segment, Trajectory

PAUSE_MODES = ("row", "batch")


@dataclass
class AgentRolloutResult:
    trajectories: List[Trajectory]
    metrics: Dict[str, float]
    stats: Dict[str, Any] = field(default_factory=dict)


class _Row:
    """One trajectory's state: "feed" (tokens to feed), "wait" (env.step running), "hold"
    (batch mode: answer back, waiting for the batch), "done"."""

    def __init__(self, index, env, record):
        self.index, self.env = index, env
        self.traj = Trajectory(record=record)
        self.state, self.pending = "feed", []
        self.turn_ids, self.turn_lps = [], []
        self.forced, self.sampled = [], 0  # end-of-turn tokens still to take; tokens sampled in the turn
        self.deadline, self.held_since = None, 0
        self.ends_by = float("inf")  # the trajectory's deadline (trajectory_timeout_s)
        self.length = 0  # tokens of the trajectory's closed segments

    def extend(self, segments):
        self.traj.segments.extend(segments)
        self.length += sum(len(s.token_ids) for s in segments)


def observation_messages(observation, role):
    """An environment's observation as messages: a text is one message of `role`; a list holds
    one message per answer (``{"role", "content"}`` dicts, or texts of `role`), in order."""
    if isinstance(observation, (list, tuple)):
        if not observation:
            raise ValueError("the environment's observation is an empty list of messages")
        return [{"role": m.get("role", role), "content": str(m["content"])} if isinstance(m, dict)
                else {"role": role, "content": str(m)} for m in observation]
    return [{"role": role, "content": str(observation)}]


def _step_worker(env, text, index, results):
    start = time.perf_counter()
    try:
        out, error = env.step(text), None
    except Exception as err:  # noqa: BLE001 - the environment's failure ends this row only
        out, error = None, err
    results.put((index, out, error, start, time.perf_counter()))


class AgentRollout:
    """The loop of :func:`rollout_trajectories` (see the module docstring)."""

    decoder_hook = None  # hook(build) -> the decoder; ppo/agents/tp_rollout.py shares the build with other ranks

    def __init__(self, engine, records, settings, turn_format, params, *, env_factory=None, pause="row", feed_interval=4):
        if pause not in PAUSE_MODES:
            raise ValueError(f"pause must be one of {PAUSE_MODES}, got {pause!r}")
        self.engine, self.settings, self.format, self.params = engine, settings, turn_format, params
        self.tokenizer = turn_format.tokenizer
        self.pause, self.step_timeout_s = pause, float(settings.step_timeout_s)
        self.trajectory_timeout_s = float(settings.trajectory_timeout_s or 0.0)
        set_tool_limits(settings.max_concurrent_tool_calls, settings.tool_timeout_s)
        self.feed_interval, self.steps = max(int(feed_interval), 1), 0
        factory = env_factory or (lambda record: record_environment(settings, record))  # ppo/agents/record_env.py
        self.rows = [_Row(i, env, r) for i, (env, r) in enumerate(zip(build_environments(factory, records), records))]
        self.role = environment_facts(settings.env_name).observation_role if settings.env_name else "tool"
        for row in self.rows:  # a record that names its own environment speaks in that one's role
            row.role = record_role(settings, row.traj.record) if settings.env_name and env_factory is None else self.role
        self.stop_ids = set(params.stop_token_ids if params.stop_token_ids is not None else [engine.eos_token_id])
        strings = {s for r in self.rows for s in getattr(r.env, "stop_strings", [])} | set(params.stop_strings or [])
        self.stop_strings = sorted(s for s in strings if s)
        self.stop_sequences = [list(map(int, q)) for q in (params.stop_sequences or []) if len(q)]
        lengths = [len(self.tokenizer(s, add_special_tokens=False)["input_ids"]) for s in self.stop_strings]
        self.tail = max(lengths + [0]) + 2
        self.results = queue.Queue()

    # ------------------------------------------------------------------ setup and the loop
    def _start_rows(self):
        start = time.perf_counter()
        for row in self.rows:
            row.ends_by = start + self.trajectory_timeout_s if self.trajectory_timeout_s else float("inf")
            first = row.env.reset(row.traj.record)
            segments = self.format.prompt_segments(first, getattr(row.env, "tools", ()))
            row.extend(segments)
            row.traj.messages = [dict(m) for m in ([{"role": "user", "content": first}] if isinstance(first, str) else first)]
            row.pending = [t for s in segments for t in s.token_ids]
            if len(row.pending) + 1 > self.settings.max_total_len:
                raise ValueError(f"record {row.index}: its prompt has {len(row.pending)} tokens, no room under "
                                 f"max_total_len={self.settings.max_total_len}")

    def run(self, seed=None, row_offset=0):
        t_start = time.perf_counter()
        try:
            self._start_rows()
            decoder = self._loop(seed, row_offset)
        finally:
            close_all([row.env for row in self.rows])  # every one, also after an error
        trajectories = [r.traj for r in self.rows]
        return AgentRolloutResult(trajectories, agent_metrics(trajectories),
                                  self._stats(decoder, trajectories, time.perf_counter() - t_start))

    def _loop(self, seed, row_offset):
        lm = unwrap_model(self.engine.model)
        positions = getattr(lm.config, "max_position_embeddings", None)
        if positions is not None and self.settings.max_total_len > positions:
            raise ValueError(f"max_total_len={self.settings.max_total_len} exceeds the model's max_position_embeddings={positions}")
        build = partial(SlotDecoder, self.engine, lm, len(self.rows), self.settings.max_total_len, self.params, seed=seed,
                        row_offset=row_offset)
        decoder = self.decoder_hook(build) if self.decoder_hook is not None else build()
        while True:
            self._collect(block=False)
            self._release_held()
            feeds = {r.index: r.pending for r in self.rows if r.state == "feed"}
            if not feeds:
                if not any(r.state in ("wait", "hold") for r in self.rows):
                    break
                self._collect(block=True)
                continue
            quiet = {r.index for r in self.rows if r.state == "feed" and len(r.turn_ids) < self.params.min_new_tokens}
            forced = {r.index: r.forced[0] for r in self.rows if r.state == "feed" and r.forced}
            sampled = decoder.step(feeds, quiet, forced)
            self.steps += 1
            now = time.perf_counter()
            for index, (token, logprob) in sampled.items():
                if index in forced:
                    self._on_forced(self.rows[index], token, logprob, now)
                else:
                    self._on_token(self.rows[index], token, logprob, now)
            live = {r.index for r in self.rows if r.state != "done"}
            if live and len(live) <= len(decoder.rows) // 2:
                decoder.compact(live)
        return decoder

    @staticmethod
    def _stats(decoder, trajectories, wall):
        tokens = sum(len(s.token_ids) for t in trajectories for s in t.policy_segments)
        return {"tokens": tokens, "fed_tokens": decoder.fed_tokens, "forward_passes": decoder.forward_passes,
                "chunk_passes": decoder.chunk_passes, "chunk_rows": decoder.chunk_rows, "compactions": decoder.compactions,
                "repacks": decoder.repacks,
                "cache_slots": decoder.t,
                "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else 0.0}

    # ------------------------------------------------------------------ policy tokens
    def _take(self, row, token, logprob, now):
        row.pending = [token]
        row.turn_ids.append(token)
        row.turn_lps.append(logprob)
        row.traj.token_times.append(now)
        return row.length + len(row.turn_ids)

    def _on_token(self, row, token, logprob, now):
        total = self._take(row, token, logprob, now)
        row.sampled += 1
        by_string = token not in self.stop_ids and self._ends_with_stop_string(row)
        ended = token in self.stop_ids or by_string or len(row.turn_ids) >= self.params.max_new_tokens
        if not ended and total < self.settings.max_total_len:
            if now > row.ends_by:
                self._close_turn(row)
                self._finish(row, "trajectory_timeout", truncated=True)
            return
        end = list(self.format.turn_end_ids)
        if by_string and end and total + len(end) <= self.settings.max_total_len:
            row.forced = end  # the policy ended its turn: the template's end-of-turn tokens are its own
            return
        if total >= self.settings.max_total_len and token not in self.stop_ids:
            self._close_turn(row)
            self._finish(row, "max_total_len", truncated=True)
            return
        self._start_step(row)

    def _on_forced(self, row, token, logprob, now):
        self._take(row, token, logprob, now)
        row.forced = row.forced[1:]
        if not row.forced:
            self._start_step(row)

    def _start_step(self, row):
        """Close the row's turn and run env.step on what the policy sampled in a worker thread."""
        text = self._close_turn(row)
        now = time.perf_counter()
        if now > row.ends_by:
            self._finish(row, "trajectory_timeout", truncated=True)
            return
        row.state, row.deadline = "wait", min(now + self.step_timeout_s, row.ends_by)
        threading.Thread(target=_step_worker, args=(row.env, text, row.index, self.results), daemon=True,
                         name=f"env-step-{row.index}").start()

    def _ends_with_stop_string(self, row):
        """The turn ends with a stop string (of the environment or `params.stop_strings`, matched
        on the text) or a stop sequence (`params.stop_sequences`, matched on the ids)."""
        if any(row.turn_ids[-len(q):] == q for q in self.stop_sequences):
            return True
        if not self.stop_strings:
            return False
        tail = decode_exact(self.tokenizer, row.turn_ids[-self.tail:])
        return any(tail.endswith(s) for s in self.stop_strings)

    def _close_turn(self, row):
        """The turn as a policy segment; returns the text of its sampled tokens."""
        text = decode_exact(self.tokenizer, row.turn_ids)
        sampled = decode_exact(self.tokenizer, row.turn_ids[: row.sampled])
        turn = row.traj.num_turns
        row.extend([Segment("policy", row.turn_ids, text, logprobs=row.turn_lps, turn=turn)])
        end = self.format.turn_end_text
        content = text[: -len(end)] if end and text.endswith(end) else text
        row.traj.messages.append({"role": "assistant", "content": content})
        row.turn_ids, row.turn_lps, row.sampled = [], [], 0
        return sampled

    def _finish(self, row, reason, truncated=False):
        row.state, row.pending = "done", []
        row.traj.stop_reason, row.traj.truncated = reason, truncated
        if truncated:  # cut before the environment said done: its end-of-episode reward (tool_state.py)
            episode_reward(row)

    # ------------------------------------------------------------------ environment answers
    def _collect(self, block):
        """Handle the env.step results that are back (`block`: wait for at least one, or for the
        nearest deadline of a waiting row)."""
        while True:
            try:
                if block:
                    waits = [r.deadline for r in self.rows if r.state == "wait"]
                    timeout = max(min(waits) - time.perf_counter(), 0.0) if waits else None
                    item = self.results.get(timeout=timeout)
                    block = False
                else:
                    item = self.results.get_nowait()
            except queue.Empty:
                break
            self._on_result(*item)
        now = time.perf_counter()
        for row in self.rows:
            if row.state == "wait" and now > row.deadline:
                by_trajectory = row.deadline >= row.ends_by
                self._finish(row, "trajectory_timeout" if by_trajectory else "env_timeout", truncated=by_trajectory)

    def _on_result(self, index, out, error, start, end):
        row = self.rows[index]
        if row.state != "wait":
            return  # answered after its deadline: the row already ended
        if error is not None or out is None:
            row.traj.tool_calls.append({"name": None, "error": "env_error", "detail": repr(error)[:200]})
            self._finish(row, "env_error")
            return
        observation, reward, done, info = out
        info = info or {}
        turn = row.traj.num_turns - 1
        row.traj.rewards.append(float(reward))
        for call in info.get("tool_calls", []):
            row.traj.tool_calls.append({**call, "turn": turn, "start": start, "end": end})
        if done:
            self._finish(row, "done")
        elif row.traj.num_turns >= self.settings.max_turns:
            self._finish(row, "max_turns", truncated=True)
        elif observation is None:
            self._finish(row, "env_error")
        else:
            try:
                messages = observation_messages(observation, info.get("role", row.role))
            except (ValueError, KeyError, AttributeError) as err:
                row.traj.tool_calls.append({"name": None, "error": "env_error", "detail": repr(err)[:200]})
                self._finish(row, "env_error")
                return
            self._feed_observation(row, messages, turn)

    def _feed_observation(self, row, messages, turn):
        end = list(self.format.turn_end_ids)
        closed = not end or row.traj.segments[-1].token_ids[-len(end):] == end
        segments = self.format.messages_segments(messages, turn, self.settings.max_tool_response_len,
                                                 getattr(row.env, "tools", ()), turn_closed=closed)
        added = [t for s in segments for t in s.token_ids]
        if row.length + len(added) + 1 > self.settings.max_total_len:
            self._finish(row, "max_total_len", truncated=True)
            return
        row.extend(segments)
        row.traj.messages += [{"role": s.kind, "content": s.text} for s in segments if s.kind != "glue"]
        row.pending = row.pending + added  # the token that ended the turn is not in the cache yet
        row.state, row.held_since = "hold", self.steps

    def _release_held(self):
        """Held answers go in: "batch", when no row decodes or waits; "row", when no row decodes
        or the oldest has waited `feed_interval` steps (one chunked pass for the answers that
        came back meanwhile, instead of one pass per answer)."""
        held = [r for r in self.rows if r.state == "hold"]
        if not held:
            return
        decoding = any(r.state == "feed" for r in self.rows)
        if self.pause == "batch":
            release = not decoding and not any(r.state == "wait" for r in self.rows)
        else:
            release = not decoding or self.steps - min(r.held_since for r in held) >= self.feed_interval
        if release:
            for row in held:
                row.state = "feed"


def rollout_trajectories(engine, records, settings, turn_format, params, seed=None, row_offset=0, env_factory=None,
                         pause="row", feed_interval=4):
    """Run one multi-turn rollout of `records` (see the module docstring) with the engine
    `engine` (a `ppo.rollout.RolloutEngine`); returns an :class:`AgentRolloutResult`
    (trajectories, the metrics dict, stats). `settings`: `AgentSettings` (TypeError for anything
    else, e.g. a whole argument object); `env_factory`: builds one environment per record
    (default: `settings.env_name` with `settings.env_options`); `feed_interval`: answers that come
    back while other rows decode wait at most this many decode steps, to be fed in one pass with
    the others that came back; `settings.step_timeout_s`: the most seconds one `env.step` may take."""
    if not isinstance(settings, AgentSettings):
        raise TypeError(f"rollout_trajectories takes AgentSettings (AgentSettings.of(args) takes the agent fields of "
                        f"parsed arguments), got {type(settings).__name__}")
    if not engine.use_rollout_engine:
        raise NotImplementedError(
            "multi-turn rollouts (env_name) need the rollout engine: PaddleNLP's generate (use_fusemt false) cannot "
            "feed a tool's answer onto a row's KV cache mid-generation; set use_fusemt true")
    if not records:
        return AgentRolloutResult([], agent_metrics([]), {"tokens": 0, "wall_s": 0.0, "tokens_per_s": 0.0})
    from .tp_rollout import run_on_rollout_group

    def new_rollout():  # under tensor or pipeline parallel, built on one rank of the group only
        return AgentRollout(engine, records, settings, turn_format, params, env_factory=env_factory, pause=pause,
                            feed_interval=feed_interval)

    was_training = unwrap_model(engine.model).training
    unwrap_model(engine.model).eval()
    try:
        import paddle

        with paddle.no_grad():
            return run_on_rollout_group(engine, new_rollout, len(records), settings, params, seed, row_offset)
    finally:
        if was_training:
            unwrap_model(engine.model).train()


def episode_reward(row):
    """Add the environment's end-of-episode reward (`env.episode_reward()`, when it has one) to
    a trajectory the rollout cut before the environment said done (at its last turn's reward,
    or as that turn's when its step never ran); one that raises counts as an env_error."""
    hook = getattr(row.env, "episode_reward", None)
    if not callable(hook):
        return
    try:
        value = float(hook())
    except Exception as err:  # noqa: BLE001 - the environment's failure is counted, the row is already over
        row.traj.tool_calls.append({"name": None, "error": "env_error", "detail": repr(err)[:200]})
        return
    if len(row.traj.rewards) >= row.traj.num_turns and row.traj.rewards:
        row.traj.rewards[-1] += value
    else:
        row.traj.rewards.append(value)
