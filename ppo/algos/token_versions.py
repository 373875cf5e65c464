"""Per-token weights versions of a partial rollout: staleness and its metrics.

A partial rollout (slime, AReaL) lets one response span a weight update, so its tokens were
sampled by different versions of the policy. `token_versions` `[N, T]` holds each response
token's version (the training steps completed by the weights that sampled it; any value at
masked positions). Trained at step `k`, token t is `k - version_t` steps stale; the staleness
bound of a batch is its oldest token's. Example: versions `[[3, 3, 4]]`, mask `[[1, 1, 1]]`,
step 4 -> staleness `[[1, 1, 0]]`, mean 2/3, max 1.
"""
import paddle

from .masked import _float_mask, _zero_outside, masked_mean

__all__ = ["token_staleness", "token_staleness_metrics"]


def token_staleness(token_versions, mask, step):
    """`[N, T]` float32: `step - token_versions` on masked-in tokens, 0 elsewhere."""
    m = _float_mask(mask, paddle.zeros([1], dtype="float32"))
    return _zero_outside(float(step) - token_versions.astype("float32"), m)


def token_staleness_metrics(token_versions, mask, step):
    """`async/staleness_mean` (over response tokens), `async/staleness_max` (the oldest token's)
    and `async/fresh_token_frac` (tokens of the newest version in the batch), detached scalars."""
    m = _float_mask(mask, paddle.zeros([1], dtype="float32"))
    stale = token_staleness(token_versions, m, step)
    newest = paddle.min(paddle.where(m > 0, stale, paddle.full_like(stale, float("inf"))))
    fresh = _zero_outside((stale == newest).astype("float32"), m)
    return {"async/staleness_mean": masked_mean(stale, m), "async/staleness_max": paddle.max(stale),
            "async/fresh_token_frac": masked_mean(fresh, m)}
