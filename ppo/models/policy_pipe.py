"""Kept for one release: moved to `ppo.strategy.pipeline.policy_pipe`; import from there
(docs/architecture.md lists the old import paths that still work)."""
import warnings

from ppo.strategy.pipeline.policy_pipe import *  # noqa: F401,F403

warnings.warn("ppo.models.policy_pipe moved to ppo.strategy.pipeline.policy_pipe; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
