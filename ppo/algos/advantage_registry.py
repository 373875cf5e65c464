"""The advantage-estimator registry: one :class:`ppo.algos.AdvEstimator` per ``adv_estimator`` name.

Each module defines its estimators' functions and entries (``ppo.algos.advantage``: GAE, GRPO,
RLOO, REINFORCE++ (+ baseline), pass@k; ``ppo.algos.vapo``: VAPO); registering one under a name
is one entry below. An entry in a module of one's own needs none: ``adv_estimator
my_package.my_module:ENTRY`` (``ppo.entry.ppo_argument_checks.find_adv_estimator``).
Source: verl ``core_algos.register_adv_est`` / ``get_adv_estimator_fn`` (registry pattern).
"""
from .advantage import BUILT_IN_ESTIMATORS
from .vapo import VAPO_ESTIMATOR

__all__ = ["ADV_ESTIMATORS", "get_adv_estimator"]

ADV_ESTIMATORS = {e.name: e for e in (*BUILT_IN_ESTIMATORS, VAPO_ESTIMATOR)}
"""Every advantage estimator by ``adv_estimator`` name."""


def get_adv_estimator(name):
    """Return the :class:`AdvEstimator` registered under ``name`` in ``ADV_ESTIMATORS``.

    Raises ``ValueError`` naming the valid choices for an unknown name.
    Source: verl ``core_algos.get_adv_estimator_fn`` (registry pattern).
    """
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"Unknown adv_estimator {name!r}; valid choices: {sorted(ADV_ESTIMATORS)}")
    return ADV_ESTIMATORS[name]
