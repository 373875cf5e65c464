"""Kept for one release: moved to `ppo.strategy.pipeline.score_pipe`; import from there
(docs/architecture.md lists the old import paths that still work)."""
from ppo.strategy.pipeline.score_pipe import *  # noqa: F401,F403
