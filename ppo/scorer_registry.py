"""Kept for one release: moved to `ppo.scoring.registry`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.scoring.registry import *  # noqa: F401,F403
