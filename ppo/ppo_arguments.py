"""Kept for one release: moved to `ppo.entry.ppo_arguments`; import from there
(docs/architecture.md lists the old import paths that still work)."""
import warnings

from ppo.entry.ppo_arguments import *  # noqa: F401,F403

warnings.warn("ppo.ppo_arguments moved to ppo.entry.ppo_arguments; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
