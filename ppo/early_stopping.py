"""Kept for one release: moved to `ppo.evaluation.early_stopping`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.evaluation.early_stopping import *  # noqa: F401,F403
