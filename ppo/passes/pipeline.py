"""Kept for one release: moved to `ppo.strategy.pipeline.passes`; import from there
(docs/architecture.md lists the old import paths that still work)."""
import warnings

from ppo.strategy.pipeline.passes import *  # noqa: F401,F403

warnings.warn("ppo.passes.pipeline moved to ppo.strategy.pipeline.passes; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
