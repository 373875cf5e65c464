"""The rollout engine's op set: the compiled kernels of csrc/ or their pure-Paddle twins (fallback.py).

`get_ops(kernels, place, dtype)` returns an object with the eight rollout ops (`ROLLOUT_OPS`) as
methods, chosen by the run argument `rollout_kernels` (`KERNEL_MODES`):

- "paddle": the pure-Paddle twins for every op (`FallbackOps`);
- "custom": the compiled C++/CUDA kernels (`CustomOps`), unchecked; an error when the library
  cannot be loaded;
- "auto" (default): the compiled kernels, each first run once on small fixed inputs against
  Paddle's plain ops (kernel_check.py); an op whose kernel disagrees, raises or gives NaN runs
  its pure-Paddle twin instead (`MixedOps`), with one warning naming it.

Without the compiled library (`ppo.kernels`, built by `python csrc/build_ops.py`) "auto" runs the
pure-Paddle twins and ONE warning says so (the engine is then slower, never silently).
"""
import paddle

from ..kernels import notice_fallback, unavailable_reason
from . import fallback

KERNEL_MODES = ("auto", "custom", "paddle")
ROLLOUT_OPS = ("rms_norm", "add_rms_norm", "swiglu", "pack_transposed", "attention", "sample", "update",
               "moe_experts")


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

    def moe_experts(self, x, weights, indices, gate_up, down):
        """The routed experts of an MoE MLP (`moe_mlp.moe_experts`); a CPU float32 kernel, the
        pure-Paddle twin elsewhere."""
        if not x.place.is_cpu_place() or x.dtype != paddle.float32:
            return fallback.moe_experts(x, weights, indices, gate_up, down)
        return self._run("rollout_moe_experts", x, weights, indices, list(gate_up), list(down))[0]


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
    moe_experts = staticmethod(fallback.moe_experts)


class MixedOps:
    """Per-op choice: the compiled kernel of every op in `ROLLOUT_OPS` except those named in
    `fallback_ops`, which run their pure-Paddle twins (the ops whose kernel failed its check)."""

    name = "mixed"

    def __init__(self, custom, fallback_ops):
        self.fallback_ops = tuple(op for op in ROLLOUT_OPS if op in fallback_ops)
        for op in ROLLOUT_OPS:
            setattr(self, op, getattr(FallbackOps, op) if op in self.fallback_ops else getattr(custom, op))


def get_ops(kernels="auto", place=None, dtype="float32"):
    """The op set for `rollout_kernels` = `kernels` (see the module docstring). "auto" checks the
    kernels where the engine runs them: on `place` (None: Paddle's current device) in `dtype`
    (the engine's compute dtype), once per process for each (kernel set, place, dtype)."""
    if kernels not in KERNEL_MODES:
        raise ValueError(f"rollout_kernels must be one of {KERNEL_MODES}, got {kernels!r}")
    if kernels == "paddle":
        return FallbackOps()
    if not notice_fallback():  # the library's one notice says why it is missing (once per process)
        if kernels == "custom":
            raise RuntimeError(f"rollout_kernels custom: the compiled rollout ops cannot be used ({unavailable_reason()}); "
                               "build them with `python csrc/build_ops.py` or set rollout_kernels auto or paddle")
        return FallbackOps()
    custom = CustomOps()
    if kernels == "custom":
        return custom
    from .kernel_check import failed_kernels

    failed = failed_kernels(custom, place, dtype)
    if not failed:
        return custom
    return FallbackOps() if len(failed) == len(ROLLOUT_OPS) else MixedOps(custom, failed)
