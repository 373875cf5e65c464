"""Kept for one release: moved to `ppo.serving.reward_client`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.serving.reward_client import *  # noqa: F401,F403
