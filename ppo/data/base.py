"""Core of the data layer: raw samples, the raw-dataset registry, dataset specs,
prompt formatting, the tokenised-dataset base class and padding helpers.

The shape follows PaddleNLP's `llm/alignment/ppo/data` (itself from safe-rlhf):
a `RawDataset` subclass turns one source into `RawSample` dicts and registers
itself by `NAME`/`ALIASES`; a `TokenizedDataset` mixes raw datasets by
proportion and tokenises them; its `get_collator()` pads a list of items into a
batch of int64 paddle tensors.

Registering your own data (as in PaddleNLP's README)::

    class MyDataset(RawDataset):
        NAME = "my-data"
        ALIASES = ("mine",)

        def __init__(self, path=None):
            self.data = [...]

        def __getitem__(self, index) -> RawSample:
            return RawSample(input=..., answer=...)

        def __len__(self):
            return len(self.data)

    SupervisedDataset("my-data:0.5,alpaca:1:/data/alpaca.json", tokenizer)
"""
from __future__ import annotations

import abc
import difflib
import logging
import sys
from typing import Any, ClassVar, Collection, Iterator, List, Optional, Tuple, Union

from paddle.io import Dataset
from typing_extensions import NotRequired, TypedDict

from ..common.argument_problems import UsageError

__all__ = [
    "IGNORE_INDEX",
    "DEFAULT_TEMPLATE",
    "PROMPT_BEGIN",
    "PROMPT_USER",
    "PROMPT_ASSISTANT",
    "PROMPT_INPUT",
    "DataError",
    "UnknownDatasetError",
    "RawSample",
    "RawDataset",
    "DatasetSpec",
    "parse_dataset_spec",
    "parse_dataset",
    "mix_raw_datasets",
    "merge_raw_datasets",
    "format_prompt",
    "sample_conversation",
    "TokenizedDataset",
    "CollatorBase",
    "left_padding",
    "right_padding",
    "position_ids_from_mask",
]

IGNORE_INDEX: int = -100
"""Label value the loss ignores (prompt and padding positions)."""

PROMPT_BEGIN: str = "BEGINNING OF CONVERSATION: "
PROMPT_USER: str = "USER: {input} "
PROMPT_ASSISTANT: str = "ASSISTANT:"  # no trailing space: the answer follows directly
PROMPT_INPUT: str = PROMPT_BEGIN + PROMPT_USER + PROMPT_ASSISTANT
DEFAULT_TEMPLATE: str = PROMPT_INPUT
"""The Beaver (safe-rlhf) template: `BEGINNING OF CONVERSATION: USER: {input} ASSISTANT:`."""


def _logger():
    """PaddleNLP's logger once paddlenlp is loaded (it always is with a tokenizer), else `logging`'s."""
    if "paddlenlp" in sys.modules:
        from paddlenlp.utils.log import logger

        return logger
    return logging.getLogger(__name__)


# --------------------------------------------------------------------------- errors


class DataError(UsageError):
    """Bad input data. The message names the file, the 1-based line (or record) and the field.

    Attributes `path`, `line`, `field` and `reason` hold the parts; any may be None
    (a missing file has no line, a malformed JSON line no field).
    """

    def __init__(self, reason: str, path: str | None = None, line: int | None = None, field: str | None = None, unit: str = "line"):
        self.reason, self.path, self.line, self.field, self.unit = reason, path, line, field, unit
        parts = []
        if path is not None:
            parts.append(f"{path}")
        if line is not None:
            parts.append(f"{unit} {line}")
        if field is not None:
            parts.append(f"field '{field}'")
        where = ", ".join(parts)
        super().__init__(f"{where}: {reason}" if where else reason)


class UnknownDatasetError(UsageError):
    """A dataset name that no `RawDataset` subclass registered; the message lists the registered ones."""


# --------------------------------------------------------------------------- raw samples


class RawSample(TypedDict, total=False):
    """One raw text sample; which fields a tokenised dataset needs:

    - `SupervisedDataset`: `input` (or `dialogue`), `answer`;
    - `PreferenceDataset`: `input`, `answer`, `other_answer`, `better`;
    - `SafetyPreferenceDataset`: `input`, `answer`, `other_answer`, `safer`, `is_safe`, `is_other_safe`;
    - `PromptOnlyDataset`: `input` (`label` is passed on to the reward server);
    - `RankedPreferenceDataset`: `input`, `answers`, `answer_scores`; `UnpairedPreferenceDataset`:
      `input`, `answer`, `desirable` (`ppo/data/answer_sets.py`).

    Multi-turn: `input` is the list of user turns and `dialogue` the alternating
    user/assistant turns ending with the final user turn (odd length); the answer
    fields then answer that final user turn.
    """

    input: NotRequired[Union[str, List[str]]]
    """User input text, or the user turns of a multi-turn conversation."""
    answer: NotRequired[str]
    """Assistant answer text (to the final user turn)."""
    extra: NotRequired[dict]
    """The record's other fields (Jsonfile), passed to a multi-turn run's environment."""
    other_answer: NotRequired[str]
    """A second answer to the same prompt (preference data)."""
    dialogue: NotRequired[List[str]]
    """Alternating user/assistant turns `[u0, a0, u1, a1, ..., u_last]` for multi-turn data."""
    better: NotRequired[bool]
    """Whether `answer` is better than `other_answer`."""
    safer: NotRequired[bool]
    """Whether `answer` is safer than `other_answer`."""
    is_safe: NotRequired[bool]
    """Whether `answer` is safe."""
    is_other_safe: NotRequired[bool]
    """Whether `other_answer` is safe."""
    label: NotRequired[Optional[str]]
    """A reference answer (e.g. the `tgt` a rule-based reward server checks against)."""
    answers: NotRequired[List[str]]
    """k >= 2 answers to the same prompt (ranked preference data, with `answer_scores`)."""
    answer_scores: NotRequired[List[float]]
    """One score per entry of `answers`; higher is better."""
    desirable: NotRequired[bool]
    """Whether `answer` is desirable (unpaired binary feedback, e.g. KTO's thumbs up / down)."""


def sample_conversation(sample: RawSample) -> Tuple[str, List[Tuple[str, str]]]:
    """Split a raw sample into `(final_user_turn, history)`; history is a list of `(user, assistant)` pairs."""
    dialogue = sample.get("dialogue")
    if dialogue:
        if len(dialogue) % 2 != 1:
            raise ValueError(
                f"`dialogue` must alternate user/assistant turns and end with a user turn (odd length), got {len(dialogue)} turns"
            )
        history = [(dialogue[i], dialogue[i + 1]) for i in range(0, len(dialogue) - 1, 2)]
        return dialogue[-1], history
    inp = sample.get("input")
    if isinstance(inp, str):
        return inp, []
    if isinstance(inp, (list, tuple)):
        if len(inp) == 1:
            return inp[0], []
        raise ValueError(
            f"a multi-turn `input` ({len(inp)} user turns) needs `dialogue` with the assistant turns in between"
        )
    raise ValueError(f"sample has no usable `input` (got {type(inp).__name__})")


# --------------------------------------------------------------------------- registry


class RawDataset(Dataset):
    """Dataset of `RawSample` dicts. Subclasses with a `NAME` register themselves.

    `ALIASES` (not inherited) are extra names for the same class. Load one with
    `RawDataset.load(name, path=None, **kwargs)`, which calls `cls(path=path, **kwargs)`
    (`path` left out when None).
    """

    NAME: ClassVar[str]
    ALIASES: ClassVar[Collection[str]] = ()
    SAFETY_LABELS: ClassVar[str] = "none"
    """Whether samples carry `safer`, `is_safe`, `is_other_safe` (cost-model training):
    "required" (every record), "optional" (records may), "none"."""
    _REGISTRY: ClassVar[dict] = {}
    _ALIAS_TO_NAME: ClassVar[dict] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("NAME")
        if name is None:
            return
        if not isinstance(name, str) or not name:
            raise ValueError(f"{cls.__qualname__}.NAME should be a non-empty string, got {name!r}")
        registry, aliases_map = RawDataset._REGISTRY, RawDataset._ALIAS_TO_NAME
        previous = registry.get(name)
        if previous is not None and _same_definition(previous, cls):
            # the same class defined again (module re-imported): replace it
            for alias in [a for a, n in aliases_map.items() if n == name]:
                del aliases_map[alias]
        elif name in registry or name in aliases_map:
            raise ValueError(f"Duplicate dataset name '{name}' ({cls.__module__}.{cls.__qualname__})")
        aliases = cls.__dict__.get("ALIASES", ())
        if isinstance(aliases, str):
            aliases = (aliases,)
        for alias in aliases:
            if not isinstance(alias, str) or not alias:
                raise ValueError(f"{cls.__qualname__}.ALIASES should hold non-empty strings, got {alias!r}")
            if alias == name or alias in registry or alias in aliases_map:
                raise ValueError(f"Duplicate dataset alias '{alias}' ({cls.__module__}.{cls.__qualname__})")
        registry[name] = cls
        aliases_map.update(dict.fromkeys(aliases, name))

    @staticmethod
    def registered_names() -> List[str]:
        """Sorted registered dataset names (aliases left out)."""
        return sorted(RawDataset._REGISTRY)

    @staticmethod
    def registered_aliases() -> dict:
        """`{alias: name}` for every registered alias."""
        return dict(RawDataset._ALIAS_TO_NAME)

    @staticmethod
    def resolve(name: str) -> type:
        """The class registered under `name` or an alias of it; `UnknownDatasetError` otherwise."""
        registry, aliases_map = RawDataset._REGISTRY, RawDataset._ALIAS_TO_NAME
        canonical = aliases_map.get(name, name)
        if canonical in registry:
            return registry[canonical]
        known = sorted(registry) + sorted(aliases_map)
        lowered = {k.lower(): k for k in known}
        close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.5)
        hint = f" Did you mean '{lowered[close[0]]}'?" if close else ""
        raise UnknownDatasetError(
            f"Unknown dataset name '{name}'.{hint} Registered datasets: {', '.join(sorted(registry))}"
            + (f" (aliases: {', '.join(f'{a} -> {n}' for a, n in sorted(aliases_map.items()))})" if aliases_map else "")
            + ". Define a RawDataset subclass with that NAME and import it before loading."
        )

    @staticmethod
    def load(name: str, path: str | None = None, **kwargs: Any) -> "RawDataset":
        """Instantiate the dataset registered as `name` (or an alias): `cls(path=path, **kwargs)`."""
        cls = RawDataset.resolve(name)
        if path is not None:
            kwargs["path"] = path
        return cls(**kwargs)

    make = load

    @abc.abstractmethod
    def __getitem__(self, index: int) -> RawSample:
        raise NotImplementedError

    @abc.abstractmethod
    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[RawSample]:
        return (self[i] for i in range(len(self)))


def _same_definition(a: type, b: type) -> bool:
    return a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__

