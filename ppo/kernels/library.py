"""Find, check and load the compiled custom-op library of csrc/ (rollout and training kernels).

One shared library holds every op of csrc/: the rollout engine's (`rollout_*`, called through
`ppo/rollout/ops.py`) and the training kernels (`train_*`, called through
`ppo/models/fused_train_ops.py` and `ppo/optimization/optim.py`). This module only registers the library
with Paddle once per process and says whether its ops can be used; each caller keeps its own
pure-Paddle twin for when they cannot.

Library location: `csrc/build/ppo_rollout_ops/ppo_rollout_ops.so` next to this checkout (built
by `python csrc/build_ops.py`), or the path in the environment variable `PPO_ROLLOUT_OPS_LIB`.
Set `PPO_ROLLOUT_DISABLE_OPS=1` to force every caller onto its fallback.
"""
import importlib.util
import os
import subprocess
import sys

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

_state = {"loaded": None, "reason": None}


def _build_module():
    spec = importlib.util.spec_from_file_location("_ppo_build_ops", BUILD_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lib_path():
    """The library file this process loads (`$PPO_ROLLOUT_OPS_LIB` or the default build path)."""
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
    """True when every op of `OP_NAMES` is registered in this process (loading the library once)."""
    return _try_load()


def unavailable_reason():
    """Why the ops cannot be used (None when they can)."""
    _try_load()
    return _state["reason"]


def notice_fallback():
    """Log, once per process, that the ops cannot be used and why: every caller (the rollout
    engine, the training patch, the fused AdamW) runs its pure-Paddle twin then. Returns whether
    the ops can be used."""
    if _try_load():
        return True
    if not _state.get("noticed"):
        _state["noticed"] = True
        import logging

        reason = _state["reason"]
        hint = "" if "build_ops.py" in str(reason) else "; build them with `python csrc/build_ops.py`"
        logging.getLogger("ppo").warning(f"custom ops unavailable ({reason}): the rollout engine and the training kernels "
                                         f"run their pure-Paddle twins, which are slower{hint}")
    return False


def ensure_built():
    """Build the library if needed (subprocess: `python csrc/build_ops.py`) and load it; raises
    if the ops still cannot be used. The op tests call this instead of skipping."""
    if not _try_load():
        subprocess.run([sys.executable, BUILD_SCRIPT], check=True)
        _state["loaded"] = None
        if not _try_load():
            raise RuntimeError(f"custom ops unusable after building: {_state['reason']}")
    return lib_path()
