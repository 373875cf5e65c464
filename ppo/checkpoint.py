"""Kept for one release: moved to `ppo.checkpoints.checkpoint`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.checkpoints.checkpoint import *  # noqa: F401,F403
