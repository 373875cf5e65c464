"""Kept for one release: moved to `ppo.models.parallel_layers` (and `ppo.common.parallel_groups`,
`ppo.strategy.tensor.weights`, `ppo.strategy.data_order`); import from there (docs/architecture.md
lists the old import paths that still work)."""
import warnings

from ppo.models.parallel_layers import *  # noqa: F401,F403
from ppo.common.parallel_groups import *  # noqa: F401,F403
from ppo.strategy.tensor.weights import *  # noqa: F401,F403
from ppo.strategy.data_order import *  # noqa: F401,F403

warnings.warn("ppo.models.tensor_parallel moved to ppo.models.parallel_layers, ppo.common.parallel_groups, "
              "ppo.strategy.tensor.weights and ppo.strategy.data_order; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
