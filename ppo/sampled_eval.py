"""Kept for one release: moved to `ppo.evaluation.sampled`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.evaluation.sampled import *  # noqa: F401,F403
