"""Fused training ops (forward + backward) and their pure-Paddle twins.

Each ``fused_*`` function runs the C++ kernel of ``csrc/cpu/train_ops.cc`` (autograd through the
op's registered backward) when the custom-op library is loaded, the tensors are float32 and on
the CPU; otherwise it runs its ``*_reference`` twin, which computes the same formula with
Paddle ops. The tests check kernel against twin and the twin against finite differences.
"""
import paddle

from ppo import kernels


def _run(name, *args):
    return paddle._C_ops._run_custom_op(name, *args)


def kernels_usable(*tensors):
    """True when the C++ training kernels can take these tensors (library loaded, float32, CPU)."""
    if not kernels.ops_available():
        return False
    return all(t.dtype == paddle.float32 and t.place.is_cpu_place() for t in tensors)


# ---------------------------------------------------------------- RMSNorm
def rms_norm_reference(x, weight, eps):
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` for ``x [..., H]``, ``weight [H]``; the
    variance in float32 and the result cast back to a half-precision weight's dtype, as
    PaddleNLP's LlamaRMSNorm (float64 stays float64, for gradient checks)."""
    with paddle.amp.auto_cast(False):
        wide = x if x.dtype == paddle.float64 else x.astype("float32")
        variance = paddle.square(wide).mean(-1, keepdim=True)
        normed = paddle.rsqrt(variance + eps) * x
    if weight.dtype in (paddle.float16, paddle.bfloat16):
        normed = paddle.cast(normed, weight.dtype)
    return normed * weight


def fused_rms_norm(x, weight, eps):
    """RMSNorm of ``x [..., H]`` with ``weight [H]``: one C++ kernel forward and one backward."""
    if kernels_usable(x, weight):
        return _run("train_rms_norm", x, weight, float(eps))[0]
    return rms_norm_reference(x, weight, eps)


# ---------------------------------------------------------------- RoPE
def rotate_half(x):
    """``concat(-x2, x1)`` over the last axis (halves ``x1``, ``x2``)."""
    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


def rope_reference(q, k, cos, sin):
    """PaddleNLP's RoPE ``x * cos + rotate_half(x) * sin`` for ``q [B, S, Hq, D]`` and
    ``k [B, S, Hk, D]`` with ``cos``/``sin`` ``[Bc, S, D]`` (``Bc`` 1 or B); returns both."""
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def fused_rope(q, k, cos, sin):
    """`rope_reference` in one C++ kernel per direction (no gradient to ``cos``/``sin``)."""
    if kernels_usable(q, k, cos, sin):
        out = _run("train_rope", q, k, cos, sin)
        return out[0], out[1]
    return rope_reference(q, k, cos, sin)


# ---------------------------------------------------------------- SwiGLU
def swiglu_reference(x, y=None):
    """``silu(gate) * up``: ``gate, up = x, y``, or the halves of ``x [..., 2I]`` when ``y`` is None."""
    if y is None:
        half = x.shape[-1] // 2
        x, y = x[..., :half], x[..., half:]
    return x * paddle.nn.functional.sigmoid(x) * y  # Paddle's silu backward gives NaN at x = -100


def fused_swiglu(x, y=None):
    """`swiglu_reference` in one C++ kernel per direction."""
    if kernels_usable(x, *(() if y is None else (y,))):
        if y is None:
            return _run("train_swiglu_fused", x)[0]
        return _run("train_swiglu", x, y)[0]
    return swiglu_reference(x, y)


# ---------------------------------------------------------------- attention
def sdpa_reference(q, k, v, mask, scale):
    """``softmax(scale * q k^T + mask) v`` with heads merged: ``q``, ``k``, ``v`` ``[B, S, H, D]``,
    additive ``mask`` ``[1 or B, 1, S, S]``; returns ``[B, S, H * D]`` (softmax in float32)."""
    B, S, H, D = q.shape
    qh, kh, vh = (t.transpose([0, 2, 1, 3]) for t in (q, k, v))
    scores = paddle.matmul(qh, kh, transpose_y=True) * scale + mask
    wide = scores if scores.dtype == paddle.float64 else scores.astype("float32")  # float64 kept for gradient checks
    probs = paddle.nn.functional.softmax(wide, axis=-1).astype(q.dtype)
    return paddle.matmul(probs, vh).transpose([0, 2, 1, 3]).reshape([B, S, H * D])


def fused_sdpa(q, k, v, mask, scale):
    """`sdpa_reference` with the transposes, scale, mask and softmax (and their gradients) in one
    C++ op around Paddle's matmuls."""
    if kernels_usable(q, k, v, mask):
        return _run("train_sdpa", q, k, v, mask, float(scale))[0]
    return sdpa_reference(q, k, v, mask, scale)


# ---------------------------------------------------------------- LM-head log-probs / entropy
class LogitKernels:
    """The fused per-chunk kernels ``ppo.algos.token_logprobs_from_hidden`` takes
    (``csrc/cpu/train_lm_head.cc``); its own Paddle code is their twin."""

    @staticmethod
    def accepts(z):
        """Float32 CPU logits and the library loaded."""
        return kernels_usable(z)

    @staticmethod
    def stats(z, y, with_entropy):
        """``(logp [c], entropy [c] or None, lse [c])`` of logits ``z [c, V]`` at labels ``y [c]``."""
        logp, entropy, lse = _run("train_logit_stats", z, y.astype("int64"), bool(with_entropy))
        return logp, (entropy if with_entropy else None), lse

    @staticmethod
    def grad_z(z, y, grad_logp, grad_entropy=None):
        """d(sum g_logp * logp + g_entropy * entropy)/dz ``[c, V]``, written over ``z``."""
        y = y.astype("int64")
        lse = _run("train_logit_stats", z, y, False)[2]
        _run("train_logit_dz", z, y, lse, grad_logp, grad_entropy, grad_entropy is not None)
        return z


LOGIT_KERNELS = LogitKernels()
