"""Kept for one release: moved to `ppo.data.prompt_sampler`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.data.prompt_sampler import *  # noqa: F401,F403
