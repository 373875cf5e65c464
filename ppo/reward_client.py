"""Kept for one release: moved to `ppo.serving.reward_client`; import from there
(docs/architecture.md lists the old import paths that still work)."""
import warnings

from ppo.serving.reward_client import *  # noqa: F401,F403

warnings.warn("ppo.reward_client moved to ppo.serving.reward_client; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
