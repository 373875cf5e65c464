"""`TokenizedDataset`: raw datasets mixed by proportion, tokenised, with their collator; and
the mixing helpers."""
from __future__ import annotations

import abc
import copy
from typing import Any, Callable, ClassVar, List, Optional, Tuple

import numpy as np
from paddle.io import Dataset

from .base import DEFAULT_TEMPLATE, IGNORE_INDEX, DataError, RawDataset, RawSample, _logger, sample_conversation
from .collate import format_prompt
from .encode import encode_exact, encode_text
from .specs import parse_dataset_spec

DEFAULT_MAX_LENGTH = 512
"""The default longest tokenised prompt+answer (the argument `max_length`, and the datasets' own)."""

# --------------------------------------------------------------------------- tokenised datasets


class TokenizedDataset(Dataset):
    """Mixes raw datasets by proportion and tokenises every sample eagerly.

    Args:
        datasets: dataset specs, see `parse_dataset_spec` (`"name[:proportion[:path]]"`,
            comma-separated string, list or dict); None: no records, an instance that only
            tokenises the samples handed to `preprocess` (`ppo.data.streaming`).
        tokenizer: a PaddleNLP tokenizer.
        max_length: longest tokenised sequence (prompt + answer) kept.
        prompt_template: text template with `{input}`; default the Beaver template.
        use_chat_template: format prompts with `tokenizer.apply_chat_template` instead.
        seed: seed of the proportional sub-sampling.
        prompt_key, response_key: read each raw dataset's prompt / reference-answer field from
            these fields (`LocalFileDataset`); None keeps every format's own names.

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
        max_length: Optional[int] = DEFAULT_MAX_LENGTH,
        prompt_template: str = DEFAULT_TEMPLATE,
        use_chat_template: bool = False,
        seed: int = 42,
        prompt_key: Optional[str] = None,
        response_key: Optional[str] = None,
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
        self.field_key_settings = dict(prompt_key=prompt_key, response_key=response_key)
        self.stats = dict.fromkeys(self.STAT_KEYS, 0)
        self._current = -1
        if datasets is None:  # no records: `preprocess` and the collator only (`ppo.data.streaming`)
            self.dataset_specs, self.raw_datasets, self.rawdata, self.sources, self.data = [], [], [], [], []
            return
        self.dataset_specs = parse_dataset_spec(datasets)
        self.raw_datasets = [load_raw_dataset(name, path, prompt_key=prompt_key, response_key=response_key)
                             for name, _, path in self.dataset_specs]
        self.rawdata, self.sources = merge_raw_datasets(
            self.raw_datasets,
            [p for _, p, _ in self.dataset_specs],
            seed,
            names=[n for n, _, _ in self.dataset_specs],
        )
        self.stats = {"raw": len(self.rawdata), **self.stats}
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

        data = []
        iterator = tqdm(
            range(len(self.rawdata)),
            desc=f"Tokenizing {type(self).__name__}",
            disable=len(self.rawdata) <= 1000,
        )
        for k in iterator:
            self._current = k
            item = self.encode_sample(self.rawdata[k], self.where)
            if item is not None:
                data.append(item)
        self._current = -1
        return data

    def encode_sample(self, sample: RawSample, where: Callable[[], str]) -> Optional[dict]:
        """`preprocess` of one raw sample (a conversational one rendered first); an error names
        the sample by `where()` (None: the sample is dropped and counted in `stats`)."""
        from .trl_formats import render_conversational

        missing = [f for f in self.REQUIRED_FIELDS if sample.get(f) is None]
        if missing:
            raise ValueError(f"{type(self).__name__} needs field(s) {missing}, but {where()} lacks them")
        try:
            return self.preprocess(render_conversational(sample, self.tokenizer, self.use_chat_template))
        except (ValueError, TypeError) as e:
            if isinstance(e, DataError):
                raise
            raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{where()}: {e}") from e

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

    def length_limit(self) -> str:
        """The length limit that filtered or truncated the samples, as the log line names it."""
        return f"max_length={self.max_length}"

    def _log_stats(self) -> None:
        parts = ", ".join(f"{k}={v}" for k, v in self.stats.items())
        message = f"{type(self).__name__}: {parts} ({self.length_limit()})"
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
        """Prompt ids: `tokenizer(prompt)["input_ids"]`; after a chat template, the ids transformers
        and inference servers give the rendered text (`encode_exact`: no special tokens added, the
        newline between `<|im_end|>` and `<|im_start|>` kept)."""
        return self._encode(prompt, special=True)

    def tokenize_answer(self, answer: str) -> List[int]:
        """Answer ids: `tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos_token_id]`
        (`encode_exact` after a chat template)."""
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer ({type(self.tokenizer).__name__}) has no EOS token to end answers with")
        return self._encode(answer, special=False) + [self.tokenizer.eos_token_id]

    def _encode(self, text: str, special: bool) -> List[int]:
        if self.use_chat_template:
            return encode_exact(self.tokenizer, text)
        return encode_text(self.tokenizer, text, add_special_tokens=special)

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

    def answer_sequence(self, prompt_ids: List[int], answer: str, truncated_key: str):
        """`(input_ids [L], labels [L])` int64 of the prompt followed by `answer` fitted to
        `max_length` (labels -100 on the prompt), counting `truncated_key` when the answer was cut;
        None (counted as `dropped_prompt_too_long`) when the prompt alone fills `max_length`."""
        answer_ids = self.tokenize_answer(answer)
        fitted = self.fit_answer(prompt_ids, answer_ids)
        if fitted is None:
            self._count("dropped_prompt_too_long")
            return None
        if len(fitted) < len(answer_ids):
            self._count(truncated_key)
        return (np.asarray(prompt_ids + fitted, dtype="int64"),
                np.asarray([IGNORE_INDEX] * len(prompt_ids) + fitted, dtype="int64"))

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


def load_raw_dataset(name: str, path: Optional[str], **keys: Optional[str]) -> RawDataset:
    """`RawDataset.load(name, path)`, with the field keys that are set (`prompt_key=`,
    `response_key=`); a dataset class without `FIELD_ROLES` (not a `LocalFileDataset`) takes no
    such key, and is a `DataError` naming it."""
    keys = {k: v for k, v in keys.items() if v is not None}
    cls = RawDataset.resolve(name)
    if keys and getattr(cls, "FIELD_ROLES", None) is None:
        raise DataError(f"dataset '{name}' ({cls.__qualname__}) does not read {' / '.join(sorted(keys))}: leave it unset",
                        field=sorted(keys)[0])
    return RawDataset.load(name, path, **keys)


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
