"""Kept for one release: moved to `ppo.strategy.pipeline.passes`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.strategy.pipeline.passes import *  # noqa: F401,F403
