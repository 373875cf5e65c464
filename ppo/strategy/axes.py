"""The parallel axes over the layouts: an axis (expert parallelism, `ppo.strategy.expert`) wraps
the run's layout objects, the `Strategy` of the online loop and the `TrainerLayout` of the
PaddleNLP-`Trainer` entry points, and answers the rest by them. `build_strategy` and
`trainer_strategy` ask every registered axis in registration order and name none: a new axis is
one folder that calls `register_axis` (a module of the package, or one of your own)."""
from typing import Callable, NamedTuple


class Axis(NamedTuple):
    """One registered axis. `wrap(strategy, args)` / `wrap_trainer(layout, args)`: the layout
    object with the axis (its groups built: collective); `applies(args) -> bool`: whether the
    run's arguments ask for it."""

    name: str
    wrap: Callable
    wrap_trainer: Callable
    applies: Callable


AXES = []
"""The registered `Axis` objects, in registration order (the first wraps innermost)."""


def register_axis(name, wrap, wrap_trainer, applies):
    """Add an axis (see `Axis`); it wraps the layout objects after the axes registered before it."""
    if any(axis.name == name for axis in AXES):
        raise ValueError(f"parallel axis {name!r} is registered already")
    AXES.append(Axis(name, wrap, wrap_trainer, applies))


def with_axes(strategy, args):
    """`strategy` wrapped by every registered axis that `args` ask for, in registration order."""
    for axis in list(AXES):
        if axis.applies(args):
            strategy = axis.wrap(strategy, args)
    return strategy


def with_trainer_axes(layout, args):
    """`layout` (a `TrainerLayout`) wrapped by every registered axis that `args` ask for, in
    registration order."""
    for axis in list(AXES):
        if axis.applies(args):
            layout = axis.wrap_trainer(layout, args)
    return layout
