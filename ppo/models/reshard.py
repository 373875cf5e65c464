"""Kept for one release: moved to `ppo.strategy.tensor.reshard`; import from there
(docs/architecture.md lists the old import paths that still work)."""
import warnings

from ppo.strategy.tensor.reshard import *  # noqa: F401,F403

warnings.warn("ppo.models.reshard moved to ppo.strategy.tensor.reshard; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
