"""Per-call inputs of the rollout engine's decode loop: the repetition penalty's starting set,
the step uniforms of the sampler, and tensors placed on the engine's device."""
import numpy as np
import paddle

_U_MAX = 1.0 - 2.0 ** -20  # uniforms are drawn in [0, _U_MAX] so u * total < total in float32


def prompt_presence(input_ids, attention_mask, vocab_size):
    """`[B, V]` uint8: 1 where token v occurs among row b's real prompt tokens (the
    repetition penalty's starting set)."""
    B = input_ids.shape[0]
    presence = paddle.zeros([B * vocab_size], dtype="int32")
    flat = (paddle.arange(B, dtype="int64").unsqueeze(1) * vocab_size + input_ids).reshape([-1])
    real = paddle.nonzero(attention_mask.reshape([-1]) > 0).reshape([-1])
    if real.shape[0] > 0:
        idx = paddle.gather(flat, real)
        presence = paddle.scatter(presence, idx, paddle.ones(idx.shape, dtype="int32"), overwrite=True)
    return presence.reshape([B, vocab_size]).astype("uint8")


def step_uniforms(draw, steps, rows, place):
    """`[steps, rows]` float32 uniforms in [0, _U_MAX], one per sampled token: columns
    `[row_offset, row_offset + rows)` of the `[steps, total_rows]` draw from `seed`
    (`draw = (seed, row_offset, total_rows)`, see `RolloutEngine.generate`)."""
    seed, offset, total = draw
    if hasattr(seed, "uniforms"):  # a chunk of a partial rollout (`ppo.rollout.partial.ChunkDraw`)
        u = seed.uniforms(steps, offset, rows)
    else:
        u = np.random.default_rng(seed).random((steps, total), dtype=np.float32)[:, offset : offset + rows]
    return paddle.to_tensor(np.minimum(np.ascontiguousarray(u), np.float32(_U_MAX)), place=place)


def on_place(values, place, dtype):
    """`values` (a tensor, array or list) as a `dtype` tensor on `place`; a tensor already there is
    cast, not copied through `paddle.to_tensor` (which warns on a tensor argument)."""
    if isinstance(values, paddle.Tensor):
        if not values.place._equals(place):
            values = values._copy_to(place, False)
        return values.astype(dtype)
    return paddle.to_tensor(values, dtype=dtype, place=place)
