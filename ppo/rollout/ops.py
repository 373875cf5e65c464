"""The rollout engine's op set: the compiled kernels of csrc/ or their pure-Paddle twins (fallback.py).

`get_ops()` returns an object with the seven rollout ops as methods. With the compiled library
loaded (`ppo.kernels`, built by `python csrc/build_ops.py`) the methods call the C++/CUDA
kernels; otherwise they call the pure-Paddle implementations and ONE warning says so (the
engine is then slower, never silently).
"""
from ..kernels import notice_fallback
from . import fallback


class CustomOps:
    """The compiled kernels (C++ on CPU, CUDA on GPU)."""

    name = "custom"

    def __init__(self):
        from paddle import _C_ops

        self._run = _C_ops._run_custom_op

    def rms_norm(self, x, weight, eps, cols=False):
        return self._run("rollout_rms_norm", x, weight, float(eps), bool(cols))[0]

    def add_rms_norm(self, x, residual, weight, eps, cols=False):
        outs = self._run("rollout_add_rms_norm", x, residual, weight, float(eps), bool(cols))
        return outs[0], residual

    def swiglu(self, x, y=None, cols=False):
        return self._run("rollout_swiglu", x, y, bool(cols))[0]

    def pack_transposed(self, dst, xs):
        self._run("rollout_pack_transposed", dst, list(xs))
        return dst

    def attention(self, qkv, k_cache, v_cache, cos, sin, pos, key_mask, finished, layer, t0, num_heads,
                  num_kv_heads, head_dim, layout, scale, bias=None, cols=False):
        return self._run("rollout_attention", qkv, k_cache, v_cache, cos, sin, pos, key_mask, finished, bias,
                         int(layer), int(t0), int(num_heads), int(num_kv_heads), int(head_dim), int(layout),
                         float(scale), bool(cols))[0]

    def sample(self, logits, presence, rows, uniforms, finished, step, temperature, top_k, top_p, penalty, do_sample,
               pad_id, suppress, cols=False):
        outs = self._run("rollout_sample", logits, presence, rows, uniforms, finished, int(step), float(temperature),
                         int(top_k), float(top_p), float(penalty), bool(do_sample), int(pad_id),
                         [int(s) for s in suppress], bool(cols))
        return outs[0], outs[1]

    def update(self, tokens, logprobs, rows, finished, pos, out_tokens, out_logprobs, lengths, presence, step,
               min_new_tokens, stop_ids, stop_seqs, stop_seq_lens, update_presence):
        outs = self._run("rollout_update", tokens, logprobs, rows, finished, pos, out_tokens, out_logprobs, lengths,
                         presence, int(step), int(min_new_tokens), [int(s) for s in stop_ids],
                         [int(s) for s in stop_seqs], [int(s) for s in stop_seq_lens], bool(update_presence))
        return outs[0]


class FallbackOps:
    """The same contract in pure Paddle (ppo/rollout/fallback.py)."""

    name = "paddle"
    rms_norm = staticmethod(fallback.rms_norm)
    add_rms_norm = staticmethod(fallback.add_rms_norm)
    swiglu = staticmethod(fallback.swiglu)
    pack_transposed = staticmethod(fallback.pack_transposed)
    attention = staticmethod(fallback.attention)
    sample = staticmethod(fallback.sample)
    update = staticmethod(fallback.update)


def get_ops(prefer_custom=True):
    """CustomOps when the library is loaded, else FallbackOps (with one logged notice)."""
    if prefer_custom and notice_fallback():  # the library's one notice says why when it is missing
        return CustomOps()
    return FallbackOps()

