"""Padded rows repacked without their padding (PaddleNLP's `use_remove_padding` and
`zero_padding` for already padded batches): the real tokens of each row of a `[N, T]` batch
are laid side by side into `R <= N` rows of at most `capacity` tokens (first-fit decreasing,
`ppo.data.packing.place_samples`), each sample with its own position ids `0..len-1` and a
block-diagonal causal mask (`ppo.data.packing.block_causal_mask`), so every sample is computed
as alone in its padded row and only the pad tokens' work disappears.

`PackedRows.to_padded` gathers per-token outputs of the packed rows (`[R, L, ...]`) back to the
padded layout (`[N, T, ...]`, 0 on padding); the gather is differentiable, so losses computed
on the padded layout give the padded batch's gradients. The real tokens of a row must be
contiguous (left padding, right padding, or both: PPO's left-padded prompt + right-padded
response, the preference pairs' right padding).
"""
from dataclasses import dataclass

import numpy as np
import paddle

from ..data.packing import block_causal_mask, place_samples
from .causal_lm import causal_lm_token_logprobs

__all__ = ["PackedRows", "pack_padded", "packed_token_logprobs"]


@dataclass
class PackedRows:
    """input_ids, position_ids `[R, L]` int64; attention_mask `[R, 1, L, L]` bool; index
    `[N*T]` int64, the flat packed cell (`r*L + c`) of each padded cell (0 on padding); valid
    `[N, T]` bool, the real tokens; ends `[N]` int64, the flat packed cell of each row's last
    real token; first `[N]` int64, each row's first real column in the padded layout."""

    input_ids: paddle.Tensor
    position_ids: paddle.Tensor
    attention_mask: paddle.Tensor
    index: np.ndarray
    valid: np.ndarray
    ends: np.ndarray
    first: np.ndarray

    def to_packed(self, padded, fill=0):
        """`padded [N, T]` (no gradient needed: ids, labels, masks) -> `[R, L]` with `fill` on padding."""
        values = padded.numpy() if isinstance(padded, paddle.Tensor) else np.asarray(padded)
        R, L = self.input_ids.shape
        out = np.full([R * L], fill, dtype=values.dtype)
        out[self.index[self.valid.reshape(-1)]] = values[self.valid]
        return paddle.to_tensor(out.reshape([R, L]))

    def to_padded(self, packed):
        """`packed [R, L, ...]` -> `[N, T, ...]`, 0 on padding; differentiable."""
        R, L = packed.shape[:2]
        N, T = self.valid.shape
        flat = packed.reshape([R * L, *packed.shape[2:]])
        gathered = paddle.gather(flat, paddle.to_tensor(self.index)).reshape([N, T, *packed.shape[2:]])
        keep = paddle.to_tensor(self.valid.reshape([N, T] + [1] * (len(packed.shape) - 2)))
        return paddle.where(keep, gathered, paddle.zeros_like(gathered))


def pack_padded(input_ids, attention_mask, capacity=None):
    """`input_ids`, `attention_mask` `[N, T]` (real tokens contiguous in each row) -> `PackedRows`
    with rows of at most `capacity` tokens (default `T`, so every row fits and no packed row's
    attention is wider than the padded batch's). Raises naming a row whose real tokens have a gap."""
    real = attention_mask.numpy() != 0 if isinstance(attention_mask, paddle.Tensor) else np.asarray(attention_mask) != 0
    ids = input_ids.numpy() if isinstance(input_ids, paddle.Tensor) else np.asarray(input_ids)
    N, T = real.shape
    lengths = real.sum(axis=1)
    first = np.where(lengths > 0, real.argmax(axis=1), 0)
    gaps = np.nonzero(real.sum(axis=1) != (np.where(lengths > 0, T - real[:, ::-1].argmax(axis=1), 0) - first))[0]
    if len(gaps):
        raise ValueError(f"row {int(gaps[0])} has padding between its real tokens; rows cannot be packed")
    sizes = [max(int(n), 1) for n in lengths]  # an empty row keeps one (padding) cell
    rows, row_of, starts, L = place_samples(sizes, capacity or T)
    packed_ids = np.zeros([len(rows), L], dtype="int64")
    positions = np.zeros([len(rows), L], dtype="int64")
    segments = np.full([len(rows), L], -1, dtype="int64")
    index = np.zeros([N, T], dtype="int64")
    for n in range(N):
        r, start, size = row_of[n], starts[n], int(lengths[n])
        cols = np.arange(first[n], first[n] + size)
        packed_ids[r, start:start + size] = ids[n, cols]
        positions[r, start:start + size] = np.arange(size)
        segments[r, start:start + size] = n
        index[n, cols] = r * L + start + np.arange(size)
    ends = row_of * L + starts + np.maximum(lengths - 1, 0)
    return PackedRows(
        input_ids=paddle.to_tensor(packed_ids), position_ids=paddle.to_tensor(positions),
        attention_mask=paddle.to_tensor(block_causal_mask(segments)), index=index.reshape(-1), valid=real,
        ends=ends, first=first,
    )


def packed_token_logprobs(model, packed, counted, temperature=1.0, chunk_size=0, with_entropy=False, dtype="float32",
                          model_kwargs=None):
    """Log-probs (and entropies) of the counted tokens of a padded batch, computed on its packed
    rows: `counted [N, T]` (nonzero where a token counts; a row's first real token never does)
    -> `(logprobs [N, T], entropy [N, T] or None)` in input alignment (column t: the log-prob of
    the token at t given the tokens before it), in `dtype` (see `causal_lm_token_logprobs`), 0 where
    not counted. `model_kwargs`: further forward arguments, already in the packed layout."""
    mask = packed.to_packed(counted, 0).numpy().astype("float32")
    N, T = packed.valid.shape
    mask.reshape(-1)[packed.index.reshape(N, T)[np.arange(N), packed.first]] = 0  # no sample's first token counts
    mask = paddle.to_tensor(mask)
    logp, entropy = causal_lm_token_logprobs(
        model, packed.input_ids, packed.attention_mask, packed.input_ids, mask=mask, position_ids=packed.position_ids,
        temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy, first_counted=1, dtype=dtype,
        model_kwargs=model_kwargs,
    )
    column = lambda t: paddle.concat([paddle.zeros([t.shape[0], 1], t.dtype), t], axis=1)  # noqa: E731 [R, L-1] -> [R, L]
    return packed.to_padded(column(logp)), (packed.to_padded(column(entropy)) if with_entropy else None)
