"""Find and call the rollout custom ops (csrc/), or their pure-Paddle twins (fallback.py).

`get_ops()` returns an object with the five ops as methods. With the compiled library present
(`python csrc/build_ops.py`) the methods call the C++/CUDA kernels; otherwise they call the
pure-Paddle implementations and ONE warning says so (the engine is then slower, never silently).

Library location: `csrc/build/ppo_rollout_ops/ppo_rollout_ops.so` next to this checkout, or
the path in the environment variable `PPO_ROLLOUT_OPS_LIB`. Set `PPO_ROLLOUT_DISABLE_OPS=1` to
force the fallback.
"""
import importlib.util
import logging
import os
import subprocess
import sys

import paddle

from . import fallback

logger = logging.getLogger("ppo.rollout")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC_DIR = os.path.join(REPO_ROOT, "csrc")
BUILD_SCRIPT = os.path.join(CSRC_DIR, "build_ops.py")
DEFAULT_LIB = os.path.join(CSRC_DIR, "build", "ppo_rollout_ops", "ppo_rollout_ops.so")
OP_NAMES = (
    "rollout_rms_norm",
    "rollout_add_rms_norm",
    "rollout_swiglu",
    "rollout_pack_transposed",
    "rollout_attention",
    "rollout_sample",
    "rollout_update",
    "train_rms_norm",
    "train_rope",
    "train_swiglu",
    "train_swiglu_fused",
    "train_adamw",
    "train_sdpa",
    "train_logit_stats",
    "train_logit_dz",
)

_state = {"loaded": None, "reason": None, "noticed": False}


def _build_module():
    spec = importlib.util.spec_from_file_location("_ppo_build_ops", BUILD_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lib_path():
    return os.environ.get("PPO_ROLLOUT_OPS_LIB") or DEFAULT_LIB


def _try_load():
    """Register the library's ops in this process once; returns True when they are usable."""
    if _state["loaded"] is not None:
        return _state["loaded"]
    ok, reason = False, None
    path = lib_path()
    if os.environ.get("PPO_ROLLOUT_DISABLE_OPS", "") not in ("", "0"):
        reason = "PPO_ROLLOUT_DISABLE_OPS is set"
    elif not os.path.exists(path):
        reason = f"{path} not found (build it with `python csrc/build_ops.py`)"
    else:
        stale = False
        if path == DEFAULT_LIB and os.path.exists(BUILD_SCRIPT):
            try:
                stale = not _build_module().is_up_to_date()
            except Exception as e:  # a broken stamp is treated as stale
                stale, reason = True, f"cannot check the build stamp: {e}"
        if stale:
            reason = reason or f"{path} is older than the sources in csrc/ (rebuild: `python csrc/build_ops.py`)"
        else:
            try:
                from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

                names = load_op_meta_info_and_register_op(path)
                missing = [n for n in OP_NAMES if n not in names]
                if missing:
                    reason = f"{path} lacks ops {missing}"
                else:
                    ok = True
            except Exception as e:
                reason = f"loading {path} failed: {e}"
    _state["loaded"], _state["reason"] = ok, reason
    return ok


def ops_available():
    return _try_load()


def unavailable_reason():
    _try_load()
    return _state["reason"]


def ensure_built():
    """Build the library if needed (subprocess: `python csrc/build_ops.py`) and load it; raises
    if the ops still cannot be used. The op tests call this instead of skipping."""
    if not _try_load():
        subprocess.run([sys.executable, BUILD_SCRIPT], check=True)
        _state["loaded"] = None
        if not _try_load():
            raise RuntimeError(f"rollout custom ops unusable after building: {_state['reason']}")
    return lib_path()


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
    if prefer_custom and _try_load():
        return CustomOps()
    if prefer_custom and not _state["noticed"]:
        _state["noticed"] = True
        logger.warning(
            "ppo.rollout: custom ops unavailable (%s); the rollout engine runs its pure-Paddle fallback, "
            "which is slower. Build them with `python csrc/build_ops.py`.",
            _state["reason"],
        )
    return FallbackOps()

