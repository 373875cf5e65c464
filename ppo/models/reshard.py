"""Kept for one release: moved to `ppo.strategy.tensor.reshard`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.strategy.tensor.reshard import *  # noqa: F401,F403
