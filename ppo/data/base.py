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
import copy
import difflib
import logging
import math
import os
import sys
from typing import Any, Callable, ClassVar, Collection, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np
import paddle
from paddle.io import Dataset
from typing_extensions import NotRequired, TypedDict

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


class DataError(ValueError):
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


class UnknownDatasetError(ValueError):
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


# --------------------------------------------------------------------------- dataset specs

DatasetSpec = Tuple[str, float, Optional[str]]


def _check_proportion(value: Any, spec: Any) -> float:
    bad = f"Bad proportion {value!r} in dataset spec {spec!r}: expected a number > 0"
    if isinstance(value, bool):
        raise ValueError(bad)
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return 1.0
        try:
            value = float(text)
        except ValueError:
            raise ValueError(bad) from None
    if not isinstance(value, (int, float)) or not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(bad)
    return float(value)


def _check_name(name: Any, spec: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"Bad dataset spec {spec!r}: the dataset name is empty")
    return name.strip()


def _check_path(path: Any, spec: Any) -> Optional[str]:
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"Bad dataset spec {spec!r}: the path is empty")
    path = str(path).strip()
    if path.startswith("path="):  # PaddleNLP habit: `name:0.5:path=/x`
        path = path[len("path=") :]
    return os.path.expanduser(path)


FILE_NAME_SUFFIXES = (".jsonl", ".jsonlines", ".ndjson", ".json")
BARE_PATH_DATASET = "Jsonfile"
"""A dataset name that is a path to a .json/.jsonl file is read with this format (as
PaddleNLP's `train_datasets: ppo-kk/34567ppl/train.jsonl`)."""


def _parse_one_string(spec: str) -> DatasetSpec:
    name, _, rest = spec.partition(":")
    proportion, sep, path = rest.partition(":")  # a path may contain ':' after the second colon
    name, proportion = _check_name(name, spec), _check_proportion(proportion, spec)
    if not sep and name.lower().endswith(FILE_NAME_SUFFIXES) and name not in RawDataset._REGISTRY and name not in RawDataset._ALIAS_TO_NAME:
        return BARE_PATH_DATASET, proportion, _check_path(name, spec)
    return name, proportion, _check_path(path, spec) if sep else None


def parse_dataset_spec(spec: Any) -> List[DatasetSpec]:
    """Parse dataset specs into a list of `(name, proportion, path)`.

    Accepted forms:
    - `"name"`, `"name:proportion"`, `"name:proportion:path"` (the path may itself
      contain ':'; everything after the second colon is the path; a `path=` prefix
      is stripped); an empty proportion means 1.0;
    - a comma-separated string of those (paths with commas need the list/dict form);
    - a list whose items are such strings or tuples `(name[, proportion[, path]])`
      or `(name, {"proportion": p, "path": ...})`;
    - a dict `{name: proportion}` or `{name: {"proportion": p, "path": ...}}`.

    The same name may appear more than once (e.g. two files of one format).
    A proportion that is not a number or is <= 0 raises `ValueError` naming the spec.
    """
    out: List[DatasetSpec] = []
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
        out = [_parse_one_string(s) for s in items]
    elif isinstance(spec, dict):
        for name, attrs in spec.items():
            out.append(_parse_name_attrs(name, attrs, {name: attrs}))
    elif isinstance(spec, (list, tuple)):
        for item in spec:
            if isinstance(item, str):
                out.extend(parse_dataset_spec(item) if "," in item else [_parse_one_string(item.strip())])
            elif isinstance(item, dict):
                out.extend(parse_dataset_spec(item))
            elif isinstance(item, (list, tuple)) and 1 <= len(item) <= 3:
                if len(item) == 2 and isinstance(item[1], dict):
                    out.append(_parse_name_attrs(item[0], item[1], item))
                else:
                    name = _check_name(item[0], item)
                    proportion = _check_proportion(item[1], item) if len(item) > 1 else 1.0
                    path = _check_path(item[2], item) if len(item) > 2 else None
                    out.append((name, proportion, path))
            else:
                raise ValueError(f"Bad dataset spec {item!r}: expected a string, a (name, proportion, path) tuple or a dict")
    else:
        raise ValueError(f"Bad dataset spec {spec!r}: expected a string, a list or a dict")
    if not out:
        raise ValueError(f"Bad dataset spec {spec!r}: no dataset given")
    return out


def _parse_name_attrs(name: Any, attrs: Any, spec: Any) -> DatasetSpec:
    name = _check_name(name, spec)
    if isinstance(attrs, dict):
        unknown = set(attrs) - {"proportion", "path"}
        if unknown:
            raise ValueError(f"Bad dataset spec {spec!r}: unknown key(s) {sorted(unknown)}; allowed: proportion, path")
        proportion = _check_proportion(attrs.get("proportion", 1.0), spec)
        return name, proportion, _check_path(attrs.get("path"), spec)
    return name, _check_proportion(attrs, spec), None


def parse_dataset(string: str) -> Tuple[str, dict]:
    """PaddleNLP-compatible form of one spec: `(name, {"proportion": p[, "path": path]})`."""
    name, proportion, path = _parse_one_string(string.strip())
    attrs = {"proportion": proportion}
    if path is not None:
        attrs["path"] = path
    return name, attrs


# --------------------------------------------------------------------------- prompts


def _render_template(template: str, text: str) -> str:
    return template.replace("{input}", text)


def format_prompt(
    input: str,  # noqa: A002 - the PaddleNLP/safe-rlhf name
    tokenizer: Any = None,
    template: str = DEFAULT_TEMPLATE,
    use_chat_template: bool = False,
    history: Optional[Iterable[Tuple[str, str]]] = None,
) -> str:
    """The prompt text for the final user turn `input` after `history` `[(user, assistant), ...]`.

    With a text template (must contain `{input}`; replaced literally, so braces in
    the text are safe): each earlier pair is rendered as
    `template(user) + assistant + " "`, then `template(input)`; e.g. with
    `USER: {input} ASSISTANT:` and history `[("hi", "yo")]`:
    `USER: hi ASSISTANT:yo USER: {input} ASSISTANT:`.

    With `use_chat_template=True`: `tokenizer.apply_chat_template([[u0, a0], ..., [input]], tokenize=False)`
    (PaddleNLP's); raises ValueError if the tokenizer has no chat template.
    """
    if not isinstance(input, str):
        if isinstance(input, (list, tuple)) and len(input) == 1 and isinstance(input[0], str):
            input = input[0]  # noqa: A001
        else:
            raise TypeError(f"format_prompt: `input` must be a str (the final user turn), got {type(input).__name__}")
    pairs = [(str(u), str(a)) for u, a in (history or [])]
    if use_chat_template:
        if tokenizer is None:
            raise ValueError("format_prompt: use_chat_template=True needs the tokenizer")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"use_chat_template=True but the tokenizer ({type(tokenizer).__name__}, "
                f"{getattr(tokenizer, 'name_or_path', '?')}) has no chat template; "
                "set one (tokenizer.init_chat_template(...) or chat_template.json) or use a text template"
            )
        conversation = [[u, a] for u, a in pairs] + [[input]]
        return tokenizer.apply_chat_template(conversation, tokenize=False)
    if "{input}" not in template:
        raise ValueError(f"prompt template {template!r} has no '{{input}}' placeholder")
    buffer = [_render_template(template, u) + a + " " for u, a in pairs]
    buffer.append(_render_template(template, input))
    return "".join(buffer)


# --------------------------------------------------------------------------- padding


def right_padding(sequences: List[Any], padding_value: int = 0, dtype: str = "int64", width: Optional[int] = None) -> np.ndarray:
    """Stack 1-D sequences into `[B, T]` (T = `width` or the longest), padding on the right."""
    arrs = [np.asarray(s, dtype=dtype) for s in sequences]
    width = max((len(a) for a in arrs), default=0) if width is None else width
    out = np.full([len(arrs), width], padding_value, dtype=dtype)
    for i, a in enumerate(arrs):
        out[i, : len(a)] = a
    return out


def left_padding(sequences: List[Any], padding_value: int = 0, dtype: str = "int64", width: Optional[int] = None) -> np.ndarray:
    """Stack 1-D sequences into `[B, T]` (T = `width` or the longest), padding on the left."""
    arrs = [np.asarray(s, dtype=dtype) for s in sequences]
    width = max((len(a) for a in arrs), default=0) if width is None else width
    out = np.full([len(arrs), width], padding_value, dtype=dtype)
    for i, a in enumerate(arrs):
        if len(a):
            out[i, width - len(a) :] = a
    return out


def position_ids_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """`cumsum(mask) - 1` clipped at 0: 0, 1, 2, ... over real tokens, 0 on (left) padding."""
    return np.clip(np.cumsum(attention_mask, axis=-1) - 1, 0, None).astype("int64")


class CollatorBase(metaclass=abc.ABCMeta):
    """Pads a list of dataset items into a batch. `return_tensors`: "pd" (int64 paddle tensors) or "np"."""

    def __init__(self, pad_token_id: int, return_tensors: str = "pd") -> None:
        if return_tensors not in ("pd", "np"):
            raise ValueError(f"return_tensors must be 'pd' or 'np', got {return_tensors!r}")
        self.pad_token_id = int(pad_token_id)
        self.return_tensors = return_tensors

    def _tensor(self, array: np.ndarray):
        array = np.asarray(array, dtype="int64")
        return paddle.to_tensor(array, dtype="int64") if self.return_tensors == "pd" else array

    @abc.abstractmethod
    def __call__(self, samples: List[dict]) -> dict:
        raise NotImplementedError


# --------------------------------------------------------------------------- tokenised datasets


class TokenizedDataset(Dataset):
    """Mixes raw datasets by proportion and tokenises every sample eagerly.

    Args:
        datasets: dataset specs, see `parse_dataset_spec` (`"name[:proportion[:path]]"`,
            comma-separated string, list or dict).
        tokenizer: a PaddleNLP tokenizer.
        max_length: longest tokenised sequence (prompt + answer) kept.
        prompt_template: text template with `{input}`; default the Beaver template.
        use_chat_template: format prompts with `tokenizer.apply_chat_template` instead.
        seed: seed of the proportional sub-sampling.

    Mixing (as safe-rlhf): a dataset of n samples with proportion p contributes
    `round(n * p)` samples: for p <= 1 a seeded sample without replacement; for p > 1
    `floor` whole copies in order plus a seeded remainder. Each dataset draws from
    its own stream `np.random.SeedSequence(seed).spawn(k)[i]`, so the result depends
    only on the seed and the specs. Datasets are concatenated in spec order.

    Prompt ids are `tokenizer(prompt_text)["input_ids"]` (BOS as the tokenizer adds it;
    with a chat template `add_special_tokens=False`, the template carries its own
    special tokens, as PaddleNLP's `apply_chat_template`). Answer ids are
    `tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos_token_id]`.

    `stats` holds the counts of kept/dropped/truncated samples (also logged).
    Items are dicts of int64 numpy arrays; `get_collator()` turns them into paddle tensors.
    """

    REQUIRED_FIELDS: ClassVar[Tuple[str, ...]] = ()
    """Raw-sample fields `preprocess` needs; a sample without one raises ValueError naming it."""
    STAT_KEYS: ClassVar[Tuple[str, ...]] = ()
    """Counters reported in `stats` (and logged) even when zero."""

    def __init__(
        self,
        datasets: Any,
        tokenizer: Any,
        max_length: Optional[int] = 512,
        prompt_template: str = DEFAULT_TEMPLATE,
        use_chat_template: bool = False,
        seed: int = 42,
    ) -> None:
        super().__init__()
        if max_length is not None and (not isinstance(max_length, int) or max_length <= 0):
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        if not use_chat_template and "{input}" not in prompt_template:
            raise ValueError(f"prompt template {prompt_template!r} has no '{{input}}' placeholder")
        if use_chat_template and not getattr(tokenizer, "chat_template", None):
            format_prompt("x", tokenizer, use_chat_template=True)  # raises the clear error
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.prompt_template = prompt_template
        self.use_chat_template = use_chat_template
        self.seed = seed
        self.dataset_specs = parse_dataset_spec(datasets)
        self.raw_datasets = [RawDataset.load(name, path) for name, _, path in self.dataset_specs]
        self.rawdata, self.sources = merge_raw_datasets(
            self.raw_datasets,
            [p for _, p, _ in self.dataset_specs],
            seed,
            names=[n for n, _, _ in self.dataset_specs],
        )
        self.stats = {"raw": len(self.rawdata), **dict.fromkeys(self.STAT_KEYS, 0)}
        self._current = -1
        self.data = self._tokenize_all()
        self.stats["kept"] = len(self.data)
        self._log_stats()
        if not self.data:
            files = ", ".join(str(getattr(raw, "path", None) or name) for (name, _, _), raw in zip(self.dataset_specs, self.raw_datasets))
            raise DataError(f"{type(self).__name__} has no samples: {self.empty_reason()}", path=files)

    def empty_reason(self) -> str:
        """Why no sample was kept (for the error raised when none was)."""
        if not self.stats["raw"]:
            return "the data holds no records"
        dropped = ", ".join(f"{k}={v}" for k, v in self.stats.items() if k not in ("raw", "kept") and v)
        return f"all {self.stats['raw']} records were dropped ({dropped or 'no reason counted'})"

    # ---- tokenisation

    def _tokenize_all(self) -> List[dict]:
        from tqdm import tqdm

        from .trl_formats import render_conversational

        data = []
        iterator = tqdm(
            range(len(self.rawdata)),
            desc=f"Tokenizing {type(self).__name__}",
            disable=len(self.rawdata) <= 1000,
        )
        for k in iterator:
            self._current = k
            sample = self.rawdata[k]
            missing = [f for f in self.REQUIRED_FIELDS if sample.get(f) is None]
            if missing:
                raise ValueError(f"{type(self).__name__} needs field(s) {missing}, but {self.where()} lacks them")
            try:
                item = self.preprocess(render_conversational(sample, self.tokenizer, self.use_chat_template))
            except (ValueError, TypeError) as e:
                if isinstance(e, DataError):
                    raise
                raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{self.where()}: {e}") from e
            if item is not None:
                data.append(item)
        self._current = -1
        return data

    def where(self) -> str:
        """`sample I of dataset 'NAME'` for the raw sample being tokenised (for error messages)."""
        if 0 <= self._current < len(self.sources):
            name, index = self.sources[self._current]
            for (spec_name, _, _), raw in zip(self.dataset_specs, self.raw_datasets):
                locations = getattr(raw, "locations", None)
                if spec_name == name and locations and index < len(locations):
                    return f"{locations[index]} (sample {index} of dataset '{name}')"
            return f"sample {index} of dataset '{name}'"
        return "a sample"

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def _log_stats(self) -> None:
        parts = ", ".join(f"{k}={v}" for k, v in self.stats.items())
        message = f"{type(self).__name__}: {parts} (max_length={self.max_length})"
        if self.stats.get("dropped_empty_answer"):  # data that is probably broken: say so louder
            _logger().warning(f"{message}: {self.stats['dropped_empty_answer']} samples had an empty answer and were dropped")
        else:
            _logger().info(message)

    def format_sample_prompt(self, sample: RawSample) -> Tuple[str, str]:
        """`(prompt_text, final_user_turn)` for a raw sample (a rendered conversational sample
        carries its `prompt_text`, see `ppo.data.trl_formats`)."""
        if "prompt_text" in sample:
            return sample["prompt_text"], sample["input"]
        final, history = sample_conversation(sample)
        prompt = format_prompt(
            final,
            tokenizer=self.tokenizer,
            template=self.prompt_template,
            use_chat_template=self.use_chat_template,
            history=history,
        )
        return prompt, final

    def tokenize_prompt(self, prompt: str) -> List[int]:
        """Prompt ids: `tokenizer(prompt)["input_ids"]` (no special tokens added after a chat template)."""
        if self.use_chat_template:
            return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(prompt)["input_ids"])

    def tokenize_answer(self, answer: str) -> List[int]:
        """Answer ids: `tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos_token_id]`."""
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer ({type(self.tokenizer).__name__}) has no EOS token to end answers with")
        return list(self.tokenizer(answer, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]

    def cut_prompt(self, prompt_ids: List[int], limit: Optional[int]) -> List[int]:
        """The last `limit` prompt ids (PaddleNLP's `src_length` / DPO `max_prompt_len`: the end
        of the prompt, next to the answer, is kept); counts `truncated_prompt`. None: no limit."""
        if limit is None or len(prompt_ids) <= limit:
            return prompt_ids
        self._count("truncated_prompt")
        return prompt_ids[-limit:]

    def fit_answer(self, prompt_ids: List[int], answer_ids: List[int]) -> Optional[List[int]]:
        """The answer ids cut to fit `max_length` after the prompt; None if the prompt alone reaches it.

        The EOS at the end of `answer_ids` survives only if the whole answer fits.
        """
        if self.max_length is None:
            return answer_ids
        room = self.max_length - len(prompt_ids)
        if room <= 0:
            return None
        return answer_ids[:room]

    @abc.abstractmethod
    def preprocess(self, raw_sample: RawSample) -> Optional[dict]:
        """One tokenised item, or None to drop the sample (count it in `stats`)."""
        raise NotImplementedError

    def get_collator(self, return_tensors: str = "pd") -> Callable[[List[dict]], dict]:
        raise NotImplementedError

    def _pad_token_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(self.tokenizer, "eos_token_id", None)
            _logger().warning("tokenizer has no pad token: padding with EOS (masks are built from lengths)")
        return 0 if pad is None else int(pad)

    def split_train_test(
        self, split_ratio: float = 0.2, shuffle: bool = True, seed: Optional[int] = None
    ) -> Tuple["TokenizedDataset", "TokenizedDataset"]:
        """Two shallow copies holding a seeded `1 - split_ratio` / `split_ratio` split of the items."""
        if not 0.0 < split_ratio < 1.0:
            raise ValueError(f"split_ratio must lie in (0, 1), got {split_ratio}")
        order = np.arange(len(self.data))
        if shuffle:
            np.random.default_rng(self.seed if seed is None else seed).shuffle(order)
        num_test = int(round(len(order) * split_ratio))
        parts = []
        for chosen in (order[: len(order) - num_test], order[len(order) - num_test :]):
            part = copy.copy(self)
            part.data = [self.data[i] for i in chosen]
            part.stats = dict(self.stats, kept=len(part.data))
            parts.append(part)
        return parts[0], parts[1]

    def __getitem__(self, index: int) -> dict:
        return self.data[index]

    def __len__(self) -> int:
        return len(self.data)


class PromptTruncationMixin:
    """`truncate_prompt_to` for a `TokenizedDataset`: prompts longer than this many tokens keep
    their last ones (`truncated_prompt` in `stats`, via `cut_prompt`); None keeps whole prompts."""

    def __init__(self, *args: Any, truncate_prompt_to: Optional[int] = None, **kwargs: Any) -> None:
        if truncate_prompt_to is not None and (not isinstance(truncate_prompt_to, int) or truncate_prompt_to <= 0):
            raise ValueError(f"truncate_prompt_to must be a positive int, got {truncate_prompt_to!r}")
        self.truncate_prompt_to = truncate_prompt_to
        super().__init__(*args, **kwargs)


def mix_raw_datasets(datasets: Any, seed: int = 42) -> Tuple[List[RawSample], List[Tuple[str, int]]]:
    """Load the datasets of a spec (see `parse_dataset_spec`) and mix them by proportion.

    Returns `(samples, sources)`, `sources[k] = (name, index)` saying where
    `samples[k]` came from. The rule is `TokenizedDataset`'s (which calls this).
    """
    specs = parse_dataset_spec(datasets)
    raws = [RawDataset.load(name, path) for name, _, path in specs]
    return merge_raw_datasets(raws, [p for _, p, _ in specs], seed, names=[n for n, _, _ in specs])


def merge_raw_datasets(
    raw_datasets: List[Any], proportions: List[float], seed: int = 42, names: Optional[List[str]] = None
) -> Tuple[List[RawSample], List[Tuple[str, int]]]:
    """Mix loaded raw datasets by proportion (seeded, see `TokenizedDataset`); returns `(samples, sources)`."""
    samples: List[RawSample] = []
    sources: List[Tuple[str, int]] = []
    names = names or [getattr(r, "NAME", type(r).__name__) for r in raw_datasets]
    streams = np.random.SeedSequence(seed).spawn(len(raw_datasets))
    for name, proportion, raw, stream in zip(names, proportions, raw_datasets, streams):
        n = len(raw)
        indices = _proportional_indices(n, proportion, np.random.default_rng(stream))
        if not indices:
            _logger().warning(f"dataset '{name}' ({n} samples, proportion {proportion}) contributes no sample")
        samples.extend(raw[i] for i in indices)
        sources.extend((name, i) for i in indices)
    return samples, sources


def _proportional_indices(n: int, proportion: float, rng: np.random.Generator) -> List[int]:
    """Indices into a dataset of `n` samples for `proportion` (see `TokenizedDataset`)."""
    selected = int(round(n * proportion))
    indices: List[int] = []
    while n > 0 and selected >= n:
        indices.extend(range(n))
        selected -= n
    if n > 0 and selected > 0:
        indices.extend(rng.choice(n, size=selected, replace=False).tolist())
    return indices
