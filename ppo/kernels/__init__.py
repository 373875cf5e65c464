"""The compiled custom ops of csrc/, shared by the rollout engine and training.

    from ppo import kernels
    kernels.ops_available()      # the library is loaded and has every op
    kernels.unavailable_reason() # why not (missing, stale, disabled)
    kernels.notice_fallback()    # ops_available(), logging the reason once per process when not
    kernels.ensure_built()       # build with `python csrc/build_ops.py` if needed, then load

See library.py for where the library is found and the environment variables that move or
disable it. The callers of the ops: `ppo/rollout/ops.py` (rollout kernels),
`ppo/models/fused_train_ops.py` and `ppo/optimization/optim.py` (training kernels).
"""
from .library import ensure_built, lib_path, notice_fallback, ops_available, unavailable_reason

__all__ = ["ensure_built", "lib_path", "notice_fallback", "ops_available", "unavailable_reason"]
