"""On-policy batches for distillation: the student answers the dataset's prompts itself.

GKD (Agarwal et al. 2024) trains on a mixture: with fraction `lmbda` the batch's answers are the
student's own samples (on-policy), otherwise the dataset's answers (supervised KD). TRL's
`GKDTrainer.training_step` draws `random.random() <= lmbda` per micro-batch; here the choice is
made per optimiser step by a fixed schedule (`on_policy_step`: step k is on-policy when
`floor((k + 1) lmbda) > floor(k lmbda)`), so every prefix of the run holds the fraction `lmbda` up
to one step, every rank and gradient-accumulation micro-batch of a step agree, and the same
steps are on-policy in every run.

`StudentSampler` is the plug-in that does it: it wraps the Trainer's data loader, reads one
optimiser step's micro-batches ahead (the weights are those after the previous step), replaces
the answers of an on-policy step by samples of the rollout engine (`ppo/rollout/engine.py`),
then annotates each micro-batch with the step's counted tokens over every data rank
(`ppo.common.step_tokens`), so the loss is a token mean over the whole step however it is split.
"""
import itertools
import math

import numpy as np
import paddle

from ppo.common.step_tokens import STEP_TOKENS_KEY, answer_token_count, global_token_count
from ppo.data.collate import left_padding, right_padding
from ppo.rollout import SamplingParams

ON_POLICY_KEY = "distill_on_policy"
IGNORE_INDEX = -100


def on_policy_step(step, lmbda):
    """True when optimiser step `step` (0-based) samples the student's answers: `floor((step + 1)
    * lmbda) > floor(step * lmbda)` (lmbda 0: never, 1: always, 0.5: steps 1, 3, 5, ...)."""
    return math.floor((step + 1) * lmbda + 1e-9) > math.floor(step * lmbda + 1e-9)


def prompt_rows(input_ids, labels, attention_mask):
    """The prompt of each row of a right-padded supervised batch: the real tokens before the first
    counted label. `[B, T]` numpy arrays -> list of B int64 arrays."""
    prompts = []
    for ids, lab, mask in zip(input_ids, labels, attention_mask):
        real = int(mask.sum())
        counted = np.nonzero(lab[:real] >= 0)[0]
        end = int(counted[0]) if counted.size else real
        prompts.append(np.asarray(ids[:end], dtype="int64"))
    return prompts


def on_policy_batch(prompts, response_ids, response_lengths, pad_token_id):
    """A right-padded supervised batch of `prompt + response` rows whose labels are the response
    tokens (the stop token included when sampled) and -100 elsewhere: `input_ids`,
    `attention_mask`, `labels` as int64 numpy arrays `[B, T]`. `response_ids [B, R]`,
    `response_lengths [B]` (numpy)."""
    rows, labels = [], []
    for prompt, resp, n in zip(prompts, response_ids, response_lengths):
        answer = [int(t) for t in resp[: int(n)]]
        rows.append(np.asarray(list(prompt) + answer, dtype="int64"))
        labels.append(np.asarray([IGNORE_INDEX] * len(prompt) + answer, dtype="int64"))
    return {
        "input_ids": right_padding(rows, pad_token_id),
        "attention_mask": right_padding([np.ones(len(r)) for r in rows], 0),
        "labels": right_padding(labels, IGNORE_INDEX),
    }


class StudentSampler:
    """Replaces the answers of on-policy steps by the student's samples (see the module docstring).

    `engine`: a `RolloutEngine` on the student; `args`: the distillation arguments (`lmbda`,
    `max_dec_len`, `min_dec_len`, `temperature`, `seed`, `gradient_accumulation_steps`,
    `dataset_world_size`, `dataset_rank`)."""

    def __init__(self, engine, args, pad_token_id):
        self.engine, self.pad_token_id = engine, int(pad_token_id)
        self.lmbda = float(args.lmbda)
        self.per_step = int(args.gradient_accumulation_steps)
        self.dataset_world_size = int(args.dataset_world_size)
        self.seed = int(args.seed) * 1_000_003
        self.dataset_rank = int(getattr(args, "dataset_rank", 0))
        self.params = SamplingParams(max_new_tokens=args.max_dec_len, min_new_tokens=args.min_dec_len,
                                     temperature=args.temperature, do_sample=True)
        self.step = 0

    def sample(self, batch, micro):
        """`batch` with its answers replaced by the student's samples to its prompts. The uniforms
        come from the step's seed for the whole data-parallel batch, each rank keeping its rows
        (`RolloutEngine.generate`'s `row_offset`), so a row samples the same answer on any layout."""
        ids, labels, mask = (batch[k].numpy() for k in ("input_ids", "labels", "attention_mask"))
        prompts = prompt_rows(ids, labels, mask)
        rows = len(prompts)  # this rank's rows of the step's global batch: the same draws on any layout
        out = self.engine.generate(paddle.to_tensor(left_padding(prompts, self.pad_token_id)),
                                   paddle.to_tensor(left_padding([np.ones(len(p)) for p in prompts], 0)), self.params,
                                   seed=self.seed + 101 * self.step + micro, row_offset=self.dataset_rank * rows,
                                   total_rows=rows * self.dataset_world_size)
        rebuilt = on_policy_batch(prompts, out.response_ids.numpy(), out.response_lengths.numpy(), self.pad_token_id)
        return {**batch, **{k: paddle.to_tensor(v) for k, v in rebuilt.items()}}

    def step_batches(self, group):
        """One optimiser step's micro-batches, sampled when the step is on-policy, each annotated
        with the step's counted tokens (every data rank) and whether it is on-policy."""
        on_policy = on_policy_step(self.step, self.lmbda)
        if on_policy:
            group = [self.sample(b, i) for i, b in enumerate(group)]
        total = global_token_count(sum(answer_token_count(b) for b in group), self.dataset_world_size)
        self.step += 1
        return [{**b, STEP_TOKENS_KEY: total, ON_POLICY_KEY: float(on_policy)} for b in group]

    def wrap(self, loader):
        """`loader` (a `paddle.io.DataLoader`, kept an instance of its class so the Trainer still sets
        its sampler's epoch) yielding `step_batches` of each step's micro-batches."""
        sampler = self
        base = type(loader)

        def __iter__(self):
            batches = base.__iter__(self)
            while True:
                group = list(itertools.islice(batches, sampler.per_step))
                if not group:
                    return
                yield from sampler.step_batches(group)

        loader.__class__ = type(f"StudentSampling{base.__name__}", (base,), {"__iter__": __iter__})
        return loader
