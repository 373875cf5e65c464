"""Step 1 of an online step: prompts become a rollout `Experience` (stage "rollout").

`Rollout` draws this data rank's prompt indices, repeats each prompt `rollout_n` times and
generates with the rollout engine inside the passes' `generation_weights` (the actor's current
weights, whatever the parallel strategy). One draw of uniforms covers the global batch and
each data rank keeps its rows' columns, so a row samples the same tokens whatever the
data-parallel layout. The engine's log-probs of the sampled tokens become the old log-probs
(`use_rollout_logprobs`) or are kept as `rollout_logprobs` for the rollout correction. The
draw count lives in the run state (`gen_batches`): it seeds the draw and numbers the prompt
groups (group ids never repeat across draws or ranks). An engine that records routing
(`moe_routing_replay rollout`) gives each token's experts, kept as `Experience.routing`.
With a `partial` switch (a split run's rollout rank, `partial_rollout`) the engine generates in
chunks that a weight update may interrupt (`ppo.rollout.partial`) and each token's weights
version is kept as `Experience.token_versions`; `Experience.version` is then the oldest."""
import contextlib

import paddle

from ..experience.stages import experience_from_rollout
from ..models.routing_replay import rollout_routing
from ..rollout.partial import drive, partial_chunks


class Rollout:
    """`engine`: a `RolloutEngine`; `sampling`: its `SamplingParams`; `sampler`: this data
    rank's `PromptSampler`; `dataset`: the prompt dataset; `passes`: the step's `ModelPasses`
    (their `generation_weights`); `offload`: the `OffloadPlan`; `state`: the `RunState`
    (`gen_batches`, `step`); `ranks`: the run's `Ranks`; `settings`: `RolloutSettings`;
    `partial`: None, or an object with `chunk_tokens` and `at_boundary(chunk) -> version`."""

    def __init__(self, engine, sampling, sampler, dataset, tokenizer, passes, *, offload, state, ranks, settings, partial=None):
        self.engine, self.sampling, self.sampler, self.dataset = engine, sampling, sampler, dataset
        self.tokenizer, self.passes, self.offload, self.state, self.ranks = tokenizer, passes, offload, state, ranks
        self.settings, self.partial = settings, partial
        self.collate = dataset.get_collator()
        self.metrics = {}  # a single-turn rollout adds no counts (`TrajectoryRollout` does)

    def generate(self):
        """`rollout_n` responses to each of the next prompts, as an `Experience` at stage "rollout"."""
        if self.partial is not None:
            return drive(self.generate_chunks(), self.partial.at_boundary)
        batch, input_ids, prompt_mask, seed, where = self._draw()
        with self.offload.scope("actor"), self.passes.generation_weights():
            out = self.engine.generate(input_ids, prompt_mask, self.sampling, seed=seed, **where)
        return self._experience(batch, out, None)

    def generate_chunks(self):
        """A partial rollout's `generate` as a generator (`ppo.rollout.partial.partial_chunks`): it
        yields the number of each chunk before generating it and takes the weights version that
        samples it; returns the `Experience`. The draw (prompts, draw count) is made at the first
        `next`, so a rollout rank can hold several batches at one weight update."""
        batch, input_ids, prompt_mask, seed, where = self._draw()
        chunks = partial_chunks(self.engine, input_ids, prompt_mask, self.sampling, seed, self.partial.chunk_tokens,
                                scope=self._generation_scope, **where)
        out, token_versions = yield from chunks
        return self._experience(batch, out, token_versions)

    @contextlib.contextmanager
    def _generation_scope(self):
        with self.offload.scope("actor"), self.passes.generation_weights():
            yield

    def _draw(self):
        """The next prompts and their sampling seed: `(batch, input_ids [B, Tp], prompt_mask, seed,
        {row_offset, total_rows})`, with B = prompts x `rollout_n`; advances the sampler."""
        indices = self.sampler.next_indices()
        n, ranks = self.settings.rollout_n, self.ranks
        batch = self.collate([self.dataset[i] for i in indices])
        input_ids = paddle.repeat_interleave(batch["input_ids"], n, axis=0)
        prompt_mask = paddle.repeat_interleave(batch["attention_mask"], n, axis=0)
        seed, rows = self.settings.seed + 1_000_003 * self.state.gen_batches, input_ids.shape[0]
        return batch, input_ids, prompt_mask, seed, dict(row_offset=ranks.data_rank * rows, total_rows=ranks.data_world * rows)

    def _experience(self, batch, out, token_versions):
        """The engine's output of the draw `batch` as an `Experience` at stage "rollout"."""
        draws, ranks, n_prompts = self.state.gen_batches, self.ranks, len(batch["prompt"])
        group_base = (draws * ranks.data_world + ranks.data_rank) * n_prompts
        self.state.gen_batches += 1
        exp = experience_from_rollout(batch, out, self.tokenizer.eos_token_id, repeat=self.settings.rollout_n,
                                      group_base=group_base)
        exp.version, exp.token_versions = self.state.step, token_versions
        if out.expert_indices is not None:  # routing replay: the experts of every token, aligned to `sequences`
            exp.routing = rollout_routing(out.expert_indices, exp.attention_mask)
        engine_logprobs = out.response_logprobs * exp.response_mask
        if out.logprobs_match_forward and self.settings.use_rollout_logprobs:
            exp.old_logprobs = engine_logprobs
        else:  # kept for the rollout correction against the training forward's old log-probs
            exp.rollout_logprobs = engine_logprobs
        return exp

    def skip(self):
        """Pass over the next draw without generating (its prompts and draw count are used up):
        a split run's rollout rank at a batch the layout deals to another rollout rank."""
        self.sampler.next_indices()
        self.state.gen_batches += 1

    def close(self):
        """Nothing to release at the end of the run (a split run's `RemoteRollout` tells its rollout rank)."""
