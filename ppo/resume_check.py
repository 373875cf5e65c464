"""Kept for one release: moved to `ppo.checkpoints.resume_check`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.checkpoints.resume_check import *  # noqa: F401,F403
