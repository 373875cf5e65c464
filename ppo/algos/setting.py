"""One setting of a registry entry (a policy loss, an advantage estimator), declared once beside it.

A :class:`Setting` is the entry's own argument: its name (the key of the argument file), its type,
default and help, and the values it takes (``bounds``, ``choices`` or a ``check`` of one's own).
The argument dataclasses generate their fields from these declarations
(``ppo.common.registry_settings``), the start-up pass checks each value with them
(:meth:`Setting.problem`), a function called directly guards its arguments with the same ones
(:meth:`Setting.checked`), and the argument reference lists them, so a new entry with a setting is
one file.
"""

__all__ = ["Setting", "in_range", "range_text"]


def range_text(low, low_in, high, high_in):
    """`>= 0`, `> 0` or `in (0, 1]` for bounds ``(low, low included, high, high included)``."""
    if high is None:
        return f"{'>=' if low_in else '>'} {low:g}"
    return f"in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def in_range(value, low, low_in, high, high_in):
    """Whether ``value`` lies within the bounds (None: no bound on that side)."""
    above = value >= low if low_in else value > low
    below = high is None or (value <= high if high_in else value < high)
    return above and below


class Setting:
    """One argument of a registry entry.

    ``name``: the argument (and the keyword the entry's function receives). ``type``: ``int``,
    ``float``, ``str`` or ``bool``. ``default``: the entry's default. ``help``: one sentence for
    ``--help`` and the argument reference. ``optional``: None is a value too (true when the
    default is None). ``bounds``: ``(low, low included, high, high included)``, None for an open
    side. ``choices``: the valid values. ``check``: ``check(value)`` returns what is wrong with a
    value (e.g. ``"must be even"``) or None.
    """

    __slots__ = ("name", "type", "default", "help", "optional", "bounds", "choices", "check")

    def __init__(self, name, type, default, help, optional=None, bounds=None, choices=None, check=None):
        if not str(name).isidentifier() or not help:
            raise ValueError(f"bad setting {name!r}: a name that is an identifier and a help are needed")
        self.name, self.type, self.default, self.help = name, type, default, help
        self.optional = default is None if optional is None else bool(optional)
        self.bounds = tuple(bounds) if bounds is not None else None
        self.choices = tuple(choices) if choices is not None else None
        self.check = check

    def __repr__(self):
        return f"Setting({self.name!r}, {getattr(self.type, '__name__', self.type)}, default={self.default!r})"

    def problem(self, value):
        """What is wrong with ``value`` for this setting (one line naming the key), or None: None
        where it is not optional, a value outside ``choices`` or ``bounds``, what ``check`` says."""
        if value is None:
            return None if self.optional else f"{self.name}=None (must be a value; None is not one of its values)"
        if self.choices is not None and value not in self.choices:
            return f"{self.name} must be one of {self.choices}, got {value!r}"
        if self.bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not in_range(value, *self.bounds):
                return f"{self.name}={value!r} (must be {range_text(*self.bounds)})"
        if self.check is not None:
            text = self.check(value)
            if text:
                return f"{self.name}={value!r} ({text})"
        return None

    def checked(self, value):
        """``value`` when this setting allows it, else ValueError with :meth:`problem`'s line (the
        guard of a function called directly, from the same declaration as the start-up check)."""
        problem = self.problem(value)
        if problem:
            raise ValueError(problem)
        return value

    def same_as(self, other):
        """Whether ``other`` declares the same argument (two entries sharing one setting)."""
        return all(getattr(self, slot) == getattr(other, slot) for slot in self.__slots__)


def declared_settings(settings):
    """``(defaults, declared)`` of an entry's ``settings``: a sequence of :class:`Setting` (or a
    dict name -> default of arguments declared elsewhere) as ``({name: default}, (Setting, ...))``."""
    if isinstance(settings, dict):
        return dict(settings), ()
    declared = tuple(settings or ())
    for s in declared:
        if not isinstance(s, Setting):
            raise ValueError(f"an entry's settings are ppo.algos.Setting declarations, got {s!r}")
    return {s.name: s.default for s in declared}, declared
