"""Start-up check of the compiled rollout kernels against Paddle's plain ops (`rollout_kernels auto`).

Each rollout op of a compiled kernel set (`ops.CustomOps`) is run once on small fixed inputs, on
the device and in the dtype the engine computes in, and compared with its pure-Paddle twin of
fallback.py run in float32 on the CPU from the same (rounded) inputs: RMSNorm by its formula,
SwiGLU by `F.swiglu`, attention by the plain matmul / softmax path (prefill Tq > 1 and decode
Tq = 1, GQA, left padding, a finished row, q/k/v bias, both q/k/v layouts), greedy sampling by the
argmax of the penalised and suppressed logits, top-k/top-p and unfiltered sampling on fixed
uniforms, the log-probs, the step bookkeeping, the weight packing and the routed experts of an
MoE MLP (`moe_mlp.moe_experts`); the "rows" and "cols"
layouts both. Every output and every in-place write is compared. A kernel that differs beyond the
dtype's tolerance (`TOLERANCES`), gives NaN where the reference has none, or raises, is reported
with the size of its error; `ops.get_ops` then runs that op's pure-Paddle twin instead.

The inputs come from their own `numpy.random.RandomState`, never from Paddle's generator (a run's
seeded draws are the same with or without the check), and every tensor a kernel writes into is
allocated here. The attention caches start filled with NaN, as the stale bytes of the engine's
`paddle.empty` caches can be: a kernel must never let a slot past the causal end reach its output.
The verdict is kept for the process, per (kernel set, place, dtype).
"""
import logging
import math
import time
from collections import namedtuple

import numpy as np
import paddle

from . import fallback

logger = logging.getLogger("ppo.rollout")

TOLERANCES = {"float32": (1e-3, 1e-3), "float16": (1e-2, 1e-2), "bfloat16": (4e-2, 4e-2)}
"""(atol, rtol) of a float comparison by the kernel's dtype. A correct float32 kernel is within
~1e-6 of the reference here; a float16 / bfloat16 one within a few roundings of its output
(2^-11 / 2^-8 relative); a wrong one is off by the size of its values (~1)."""

EPS = 1e-6

_VERDICTS = {}

Pair = namedtuple("Pair", ["kernel", "ref"])
"""One input twice: for the kernel (checked place and dtype) and for the reference (CPU float32,
the same rounded values). Written-into tensors are two separate copies."""


class _Inputs:
    """Fixed inputs of one check, drawn from `numpy.random.RandomState(seed)`."""

    def __init__(self, place, dtype, seed):
        self.place, self.dtype, self.rng = place, dtype, np.random.RandomState(seed)

    def pair(self, array, dtype=None):
        """`array` as a Pair; floats in `dtype` (default: the checked dtype) on the kernel side."""
        array = np.ascontiguousarray(array)
        kernel = paddle.to_tensor(array, place=self.place)
        if array.dtype == np.float32:
            dtype = dtype or self.dtype
            if dtype != "float32":
                kernel = kernel.astype(dtype)
            return Pair(kernel, paddle.to_tensor(kernel.astype("float32").numpy(), place=paddle.CPUPlace()))
        return Pair(kernel, paddle.to_tensor(array, place=paddle.CPUPlace()))

    def normal(self, shape, scale=1.0, shift=0.0, dtype=None):
        return self.pair((self.rng.standard_normal(shape) * scale + shift).astype("float32"), dtype)


def _sides(args, side):
    return [(a[side] if isinstance(a, Pair) else a) for a in args]


def _both(kernel_fn, ref_fn, *args):
    """`(kernel_fn(kernel side of args), ref_fn(reference side))`; non-Pair arguments go to both."""
    return kernel_fn(*_sides(args, 0)), ref_fn(*_sides(args, 1))


def _tokens(cols, hidden, batch=5):
    return [hidden, batch] if cols else [batch, hidden]


# --------------------------------------------------------------------------- the checks
# Each check yields (label, kernel result, reference result) triples; the first mismatch fails it.
def _rms_norm(custom, io):
    w = io.normal([64], 0.2, 1.0)
    for cols in (False, True):
        x = io.normal(_tokens(cols, 64), 2.0)
        yield f"cols={cols}", *_both(custom.rms_norm, fallback.rms_norm, x, w, EPS, cols)


def _add_rms_norm(custom, io):
    w = io.normal([64], 0.2, 1.0)
    for cols in (False, True):
        x, res = io.normal(_tokens(cols, 64)), io.normal(_tokens(cols, 64), 2.0)
        (out, _), (want, _) = _both(custom.add_rms_norm, fallback.add_rms_norm, x, res, w, EPS, cols)
        yield f"cols={cols}", out, want
        yield f"cols={cols} residual", res.kernel, res.ref


def _swiglu(custom, io):
    for cols in (False, True):
        fused = io.normal(_tokens(cols, 192), 2.0)
        yield f"fused gate/up cols={cols}", *_both(custom.swiglu, fallback.swiglu, fused, None, cols)
        gate, up = io.normal(_tokens(cols, 96), 2.0), io.normal(_tokens(cols, 96), 2.0)
        yield f"split gate/up cols={cols}", *_both(custom.swiglu, fallback.swiglu, gate, up, cols)


def _pack_transposed(custom, io):
    xs = [io.normal([32, 24]), io.normal([32, 40])]
    dst = io.pair(np.zeros([64, 32], "float32"))
    custom.pack_transposed(dst.kernel, [x.kernel for x in xs])
    fallback.pack_transposed(dst.ref, [x.ref for x in xs])
    yield "packed", dst.kernel, dst.ref


def _rope_tables(io, length, hd):
    inv = 1.0 / 10000.0 ** (np.arange(0, hd, 2, dtype="float64") / hd)
    angles = np.outer(np.arange(length), inv)
    angles = np.concatenate([angles, angles], -1)
    return io.pair(np.cos(angles).astype("float32")), io.pair(np.sin(angles).astype("float32"))


def _attention(custom, io):
    """A 16-token left-padded prefill (GQA 4:2, head_dim 64, rows of 16, 11 and 5 tokens), then two
    decode steps with row 1 finished (q/k/v bias; PaddleNLP's fused q/k/v layout in "cols")."""
    B, Tp, nh, nkv, hd, layer = 3, 16, 4, 2, 64, 1
    S, W = Tp + 8, (nh + 2 * nkv) * hd
    lens = np.array([16, 11, 5])
    mask = (np.arange(Tp)[None, :] >= Tp - lens[:, None]).astype("int32")
    key_mask = io.pair(mask)
    k_cache = io.pair(np.full([2, B, nkv, hd, S], np.nan, "float32"))
    v_cache = io.pair(np.full([2, B, nkv, S, hd], np.nan, "float32"))
    cos, sin = _rope_tables(io, S, hd)
    bias = io.normal([W], 0.1)
    live, one_done = io.pair(np.zeros(B, "int32")), io.pair(np.array([0, 1, 0], "int32"))
    steps = [  # label, qkv, positions, finished, t0, layout, bias, cols
        ("prefill", io.normal([B, Tp, W]), io.pair(np.maximum(np.cumsum(mask, 1) - 1, 0).astype("int64")), live, 0, 0,
         None, False),
        ("decode", io.normal([B, W]), io.pair(lens.astype("int64")), one_done, Tp, 0, bias, False),
        ("decode cols fused-qkv layout", io.normal([W, B]), io.pair(lens.astype("int64") + 1), one_done, Tp + 1, 1,
         None, True),
    ]
    for label, qkv, pos, finished, t0, layout, b, cols in steps:
        yield label, *_both(custom.attention, fallback.attention, qkv, k_cache, v_cache, cos, sin, pos, key_mask,
                            finished, layer, t0, nh, nkv, hd, layout, 1.0 / math.sqrt(hd), b, cols)
        yield f"{label} K cache", k_cache.kernel, k_cache.ref
        yield f"{label} V cache", v_cache.kernel, v_cache.ref


def sample_inputs(io):
    """The sampling check's inputs (rows 4, 0, 2, 3 of a batch of 5; row 2 finished; 5,003 float32
    logits, a presence table, uniforms for 5 steps) and its settings: (label, step, temperature,
    top_k, top_p, penalty, do_sample, suppressed ids, cols)."""
    B0, V, rows = 5, 5003, np.array([4, 0, 2, 3], "int64")
    logits = (io.rng.standard_normal([len(rows), V]) * 4.0).astype("float32")
    presence = (io.rng.random_sample([B0, V]) < 0.3).astype("uint8")
    uniforms = np.minimum(io.rng.random_sample([5, B0]), 1.0 - 2.0 ** -20).astype("float32")
    tensors = dict(logits=logits, presence=presence, rows=rows, uniforms=uniforms,
                   finished=np.array([0, 0, 1, 0], "int32"))
    settings = [
        ("greedy, penalty, suppressed ids", 0, 0.7, 0, 1.0, 1.3, False, [2, 7], False),
        ("greedy cols", 0, 1.0, 0, 1.0, 1.0, False, [], True),
        ("top-k", 1, 1.0, 12, 1.0, 1.0, True, [], False),
        ("top-p", 2, 1.2, 0, 0.7, 1.0, True, [], False),
        ("top-k + top-p + penalty", 3, 0.9, 40, 0.9, 1.2, True, [], False),
        ("unfiltered cols", 4, 1.0, 0, 1.0, 1.0, True, [5], True),
    ]
    return tensors, settings


def _sample(custom, io):
    tensors, settings = sample_inputs(io)
    t = {k: io.pair(v, "float32") for k, v in tensors.items()}
    logits_cols = io.pair(np.ascontiguousarray(tensors["logits"].T), "float32")
    for label, step, temperature, top_k, top_p, penalty, do_sample, suppress, cols in settings:
        (tok, lp), (tok_ref, lp_ref) = _both(
            custom.sample, fallback.sample, logits_cols if cols else t["logits"], t["presence"], t["rows"],
            t["uniforms"], t["finished"], step, temperature, top_k, top_p, penalty, do_sample, 3, suppress, cols)
        yield f"{label} tokens", tok, tok_ref
        yield f"{label} log-probs", lp, lp_ref


def _update(custom, io):
    """One bookkeeping step: an EOS, a completed stop sequence [7, 8, 9], a finished row."""
    B0, N, V, step = 5, 6, 40, 3
    rows = np.array([4, 0, 2, 3], "int64")
    out_tokens = np.full([B0, N], 3, "int64")
    out_tokens[:, :step] = io.rng.randint(10, V, [B0, step])
    out_tokens[rows[1], step - 2:step] = [7, 8]
    state = dict(tokens=np.array([2, 9, 3, io.rng.randint(10, V)], "int64"),
                 logprobs=-io.rng.random_sample(4).astype("float32"), rows=rows,
                 finished=np.array([0, 0, 1, 0], "int32"), pos=io.rng.randint(5, 20, 4).astype("int64"),
                 out_tokens=out_tokens, out_logprobs=np.zeros([B0, N], "float32"), lengths=np.full(B0, step, "int64"),
                 presence=(io.rng.random_sample([B0, V]) < 0.2).astype("uint8"))
    s = {k: io.pair(v, "float32") for k, v in state.items()}
    args = [s[k] for k in ("tokens", "logprobs", "rows", "finished", "pos", "out_tokens", "out_logprobs", "lengths",
                           "presence")]
    yield "active rows", *_both(custom.update, fallback.update, *args, step, 0, [2], [7, 8, 9], [3], True)
    for name in ("finished", "pos", "out_tokens", "out_logprobs", "lengths", "presence"):
        yield name, s[name].kernel, s[name].ref


def _moe_experts(custom, io):
    """7 tokens, top-2 of 4 experts (one with no token, one with 5: a full and a partial row
    block), hidden 24, expert width 20 (column tails beside the 16-wide blocks)."""
    x, weights = io.normal([7, 24]), io.pair(io.rng.uniform(0.1, 1.0, [7, 2]).astype("float32"))
    indices = io.pair(np.array([[0, 2], [2, 0], [3, 2], [2, 0], [0, 3], [2, 3], [0, 2]], "int64"))
    gate_up, down = [io.normal([24, 40], 0.3) for _ in range(4)], [io.normal([20, 24], 0.3) for _ in range(4)]
    yield "routed sum", custom.moe_experts(x.kernel, weights.kernel, indices.kernel, [g.kernel for g in gate_up],
                                           [d.kernel for d in down]), \
        fallback.moe_experts(x.ref, weights.ref, indices.ref, [g.ref for g in gate_up], [d.ref for d in down])


CHECKS = {"rms_norm": _rms_norm, "add_rms_norm": _add_rms_norm, "swiglu": _swiglu,
          "pack_transposed": _pack_transposed, "attention": _attention, "sample": _sample, "update": _update,
          "moe_experts": _moe_experts}
"""One check per rollout op (`ops.ROLLOUT_OPS`), each with its own seed (the position here)."""


def mismatch(got, want, dtype):
    """Why the kernel result `got` is not the reference `want`, with the size of the error; None when it is.
    Integers must be equal; floats within `TOLERANCES[dtype]`, NaN exactly where the reference has NaN."""
    got_np = (got.astype("float32") if got.dtype in (paddle.float16, paddle.bfloat16) else got).numpy()
    want_np = want.numpy()
    if got_np.shape != want_np.shape:
        return f"shape {list(got_np.shape)}, expected {list(want_np.shape)}"
    if not np.issubdtype(want_np.dtype, np.floating):
        wrong = got_np != want_np
        return f"{int(wrong.sum())} of {wrong.size} values differ" if wrong.any() else None
    got_nan, want_nan = np.isnan(got_np), np.isnan(want_np)
    extra, lost = int((got_nan & ~want_nan).sum()), int((want_nan & ~got_nan).sum())
    if extra or lost:
        return (f"NaN at {extra} positions where the reference has none" if extra
                else f"values at {lost} NaN positions of the reference (written where nothing is due)")
    atol, rtol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    err = np.abs(got_np.astype("float64") - want_np)[~want_nan]
    bound = (atol + rtol * np.abs(want_np.astype("float64")))[~want_nan]
    if err.size and (err > bound).any():
        return f"max |error| {err.max():.3g} (tolerance {atol:g} + {rtol:g} x |reference|)"
    return None


def _check(name, custom, place, dtype):
    """The problem of op `name` of `custom` (first mismatching result, or the exception), or None."""
    io = _Inputs(place, dtype, seed=list(CHECKS).index(name))
    try:
        for label, got, want in CHECKS[name](custom, io):
            problem = mismatch(got, want, dtype)
            if problem:
                return f"{label}: {problem}"
    except Exception as error:  # a kernel that raises is as unusable as a wrong one
        lines = [line for line in str(error).splitlines() if line.strip()]
        return f"raised {type(error).__name__}: {lines[0][:200] if lines else ''}"
    return None


def device_name(place):
    """Paddle's name of `place` ("cpu", "gpu:0", ...); None: the current device."""
    if place is None:
        return paddle.get_device()
    text = str(place)
    return text[len("Place("):-1] if text.startswith("Place(") and text.endswith(")") else text


def failed_kernels(custom, place=None, dtype="float32"):
    """`{op: problem}` for the ops of `custom` whose kernel fails its check on `place` (None:
    Paddle's current device) in `dtype`; empty when every kernel passes. Runs once per process per
    (kernel set, place, dtype), logging one INFO line with the verdict and one warning per failed
    op; later calls return the kept verdict."""
    key = (type(custom), device_name(place), dtype)
    if key not in _VERDICTS:
        start = time.perf_counter()
        with paddle.no_grad():
            problems = {name: _check(name, custom, place, dtype) for name in CHECKS}
        failed = {name: problem for name, problem in problems.items() if problem}
        for name, problem in failed.items():
            logger.warning("ppo.rollout: the compiled %s kernel failed its start-up check against Paddle's plain ops "
                           "on %s %s (%s); the rollout engine runs the pure-Paddle %s in this process",
                           name, key[1], dtype, problem, name)
        logger.info("ppo.rollout: rollout kernels checked on %s %s in %.0f ms: compiled %s; pure Paddle %s",
                    key[1], dtype, 1e3 * (time.perf_counter() - start),
                    ", ".join(n for n in CHECKS if n not in failed) or "none", ", ".join(failed) or "none")
        _VERDICTS[key] = failed
    return dict(_VERDICTS[key])
