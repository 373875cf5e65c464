"""Step rewards of responses from a trained process reward model (`rm/run_reward.py
--process_reward true`): the PRM scorer of PPO/GRPO (`prm_reduction`, `ppo.algos.process_reward`).

A response is cut into steps on its own tokens: a step ends at the token before each token whose
text holds `step_separator` (that token starts the next step, as Math-Shepherd's newline starts
its next step), and the last step at the response's last token, so the step ends index the
generated ids the trainer trains on. The PRM reads the prompt text and the steps' texts, its
placeholder after each step (`ppo.data.process_reward.prm_sequence`, the layout it was trained
on), and gives each step `P(good) = sigmoid(score)`. An empty response is one empty step, scored
by the PRM like any other (never a free reward). With `step_tokens` N > 0 the steps are instead
every N tokens (answers written with no separator, as the tiny demo's two-character steps).
With `end_step` a response that ended with EOS gets one more step, empty, at the EOS token: the
PRM then judges where the answer stops (a PRM that never sees the end scores an answer cut short
like a whole one, and a policy trained on it learns to stop early); the PRM must have been trained
with that empty last step (`ppo.tiny.prm_data`'s layout `q9|x3|k||`).

`ProcessRewardScorer.token_steps` gives the step scores in the trainer's token layout: `[N, Tr]`
with each step's `P(good)` at its last token and a 1 there in the step mask, so that
`ppo.algos.process_reward`'s functions read them with `step_end = arange(Tr)`.
"""
from typing import List, NamedTuple, Sequence

import numpy as np
import paddle

from ..data.process_reward import placeholder_id, prm_sequence

__all__ = ["StepScores", "step_token_groups", "fixed_step_groups", "ProcessRewardScorer"]


class StepScores(NamedTuple):
    """Padded to the batch's most steps: `scores [B, S]` float32 (P(good)), `mask [B, S]` int64,
    `ends [B, S]` int64 (each step's last token, an index into the response's tokens)."""

    scores: paddle.Tensor
    mask: paddle.Tensor
    ends: paddle.Tensor


def step_token_groups(token_texts: Sequence[str], separator: str) -> List[List[int]]:
    """Token indices of each step of one response (see the module docstring); `[[ ]]` (one empty
    step) for an empty response. Example, separator "\\n": texts `["a", "b", "\\nc", "d"]` ->
    `[[0, 1], [2, 3]]`."""
    if not separator:
        raise ValueError("step_separator must not be empty")
    groups = [[]]
    for i, text in enumerate(token_texts):
        if separator in text and groups[-1]:
            groups.append([])
        groups[-1].append(i)
    return groups


def fixed_step_groups(num_tokens: int, step_tokens: int) -> List[List[int]]:
    """Token indices of steps of `step_tokens` tokens (the last may be shorter); `[[ ]]` for no
    tokens. Example: 5 tokens, 2 a step -> `[[0, 1], [2, 3], [4]]`."""
    if step_tokens < 1:
        raise ValueError(f"step_tokens must be >= 1, got {step_tokens}")
    return [list(range(i, min(i + step_tokens, num_tokens))) for i in range(0, num_tokens, step_tokens)] or [[]]


class ProcessRewardScorer:
    """`score(prompt_texts, response_ids) -> StepScores` with a process reward model.

    `model`: a score model saved by `rm/run_reward.py --process_reward true` (its config names
    `placeholder_token`); `tokenizer`: the PRM's (the responses are decoded with `policy_tokenizer`,
    default the same); `step_tokens` > 0: steps of that many tokens instead of cuts at `step_separator`."""

    def __init__(self, model, tokenizer, step_separator="\n", policy_tokenizer=None, batch_size=64, step_tokens=0,
                 end_step=False):
        config = getattr(model, "config", None)
        if not getattr(config, "process_reward", False):
            raise ValueError("the model is not a process reward model (its config has no process_reward: train one with "
                             "rm/run_reward.py --process_reward true)")
        self.model, self.tokenizer, self.separator, self.batch_size = model, tokenizer, step_separator, batch_size
        self.policy_tokenizer = policy_tokenizer or tokenizer
        self.step_tokens, self.end_step = step_tokens, end_step
        self.placeholder = placeholder_id(tokenizer, config.placeholder_token)

    def steps(self, response_ids, ended=False):
        """`(texts, ends)` of one response's steps: each step's text and its last token's index (-1 for
        the one empty step of an empty response). `ended` (with `end_step`): the response's EOS, not
        in `response_ids`, is an empty last step at index `len(response_ids)`."""
        if self.end_step and ended:
            texts, ends = self.steps(response_ids) if response_ids else ([], [])
            return texts + [""], ends + [len(response_ids)]
        if self.step_tokens > 0:
            groups = fixed_step_groups(len(response_ids), self.step_tokens)
        else:
            groups = step_token_groups([self.policy_tokenizer.decode([i]) for i in response_ids], self.separator)
        texts = [self.policy_tokenizer.decode([response_ids[i] for i in g]) if g else "" for g in groups]
        return texts, [g[-1] if g else -1 for g in groups]

    def step_logits(self, sequences):
        """The PRM's score at every placeholder of `(ids, positions)` sequences: a list of arrays."""
        out = []
        for s in range(0, len(sequences), self.batch_size):
            chunk = sequences[s:s + self.batch_size]
            width = max(len(ids) for ids, _ in chunk)
            ids = np.full((len(chunk), width), self.tokenizer.pad_token_id or 0, dtype="int64")
            mask = np.zeros((len(chunk), width), dtype="int64")
            for i, (x, _) in enumerate(chunk):
                ids[i, :len(x)], mask[i, :len(x)] = x, 1
            with paddle.no_grad():
                scores = self.model(input_ids=paddle.to_tensor(ids), attention_mask=paddle.to_tensor(mask)).scores.numpy()
            out += [scores[i, positions] for i, (_, positions) in enumerate(chunk)]
        return out

    def score(self, prompt_texts, response_ids, ended=None):
        """`StepScores` of each response (a list of token ids, without its EOS) after its prompt text;
        `ended[i]`: response i ended with EOS (used with `end_step`)."""
        texts, ends, sequences = [], [], []
        for i, (prompt, ids) in enumerate(zip(prompt_texts, response_ids)):
            steps, step_ends = self.steps(list(ids), bool(ended[i]) if ended is not None else False)
            pieces = [prompt + steps[0], *steps[1:]]
            sequences.append(prm_sequence(self.tokenizer, pieces, self.placeholder))
            texts.append(steps)
            ends.append(step_ends)
        logits = self.step_logits(sequences)
        S = max(len(x) for x in logits)
        scores, mask, end = np.zeros((len(logits), S), "float32"), np.zeros((len(logits), S), "int64"), np.zeros((len(logits), S), "int64")
        for i, (lg, e) in enumerate(zip(logits, ends)):
            scores[i, :len(lg)], mask[i, :len(lg)], end[i, :len(e)] = 1 / (1 + np.exp(-lg)), 1, np.maximum(e, 0)
        return StepScores(paddle.to_tensor(scores), paddle.to_tensor(mask), paddle.to_tensor(end))

    def token_steps(self, prompt_texts, response_ids, mask, eos_token_id=None):
        """`(step_rewards, step_mask)` `[N, Tr]` float32 of rollout rows (`response_ids`, `mask`
        `[N, Tr]` tensors): each step's `P(good)` at its last token, 1 there in the mask. The
        tokens scored are the masked ones without a final EOS (with `end_step` the EOS is the empty
        last step); an empty response's one step sits at token 0."""
        ids, m = response_ids.numpy(), mask.numpy()
        rows, ended = [], []
        for row, keep in zip(ids.tolist(), m.tolist()):
            tokens = [t for t, k in zip(row, keep) if k > 0]
            ended.append(bool(tokens) and eos_token_id is not None and tokens[-1] == eos_token_id)
            rows.append(tokens[:-1] if ended[-1] else tokens)
        steps = self.score(prompt_texts, rows, ended)
        scores, smask, ends = steps.scores.numpy(), steps.mask.numpy(), steps.ends.numpy()
        rewards, marks = np.zeros(ids.shape, "float32"), np.zeros(ids.shape, "float32")
        for i in range(len(rows)):
            for k in np.flatnonzero(smask[i]):
                rewards[i, ends[i, k]], marks[i, ends[i, k]] = scores[i, k], 1.0
        return paddle.to_tensor(rewards), paddle.to_tensor(marks)
