"""Kept for one release: moved to `ppo.evaluation.metrics`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.evaluation.metrics import *  # noqa: F401,F403
