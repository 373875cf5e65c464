"""Kept for one release: moved to `ppo.optimization.optim`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.optimization.optim import *  # noqa: F401,F403
