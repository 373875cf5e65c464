"""Kept for one release: moved to `ppo.optimization.offload`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.optimization.offload import *  # noqa: F401,F403
