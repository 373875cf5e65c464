"""Kept for one release: moved to `ppo.scoring.process_reward`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.scoring.process_reward import *  # noqa: F401,F403
