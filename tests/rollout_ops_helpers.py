"""Helpers for the rollout tests (tests/test_ops_*.py, tests/test_rollout_*.py)."""
import numpy as np
import paddle

from ppo import kernels
from ppo.rollout import ops


def custom_and_fallback_ops():
    """(custom, fallback) op sets; builds the library with `python csrc/build_ops.py` when it is
    missing or stale, and raises if the custom ops still cannot be used (tests never skip)."""
    kernels.ensure_built()
    return ops.get_ops("custom"), ops.FallbackOps()


def clone(t):
    """An independent copy (for ops that write their inputs in place)."""
    return paddle.to_tensor(t.numpy())


def assert_close(a, b, atol=1e-5, rtol=1e-5, msg=""):
    a = a.numpy() if hasattr(a, "numpy") else a
    b = b.numpy() if hasattr(b, "numpy") else b
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=rtol, err_msg=msg)
