"""PaddleNLP's `lazy` data: tokenised items of JSON-lines files, read one line at a time while
training instead of all at start-up.

PaddleNLP's `llm/alignment` scripts with `lazy: true` load the file as an iterable dataset
(`paddlenlp.datasets.load_dataset(..., lazy=True)`, packed by `ZeroPaddingIterableDataset`)
that reads and tokenises records as the Trainer asks for batches. `StreamingDataset` does the
same with the record formats and tokenised-dataset classes of `ppo.data`: memory holds one
record and one batch, whatever the file's size, and the files are read in order (no
shuffling; PaddleNLP's lazy data is not shuffled either).

Where the stream stands is a `position`: `{"epoch", "source", "offset", "line", "path"}`, the
byte offset and line number of the next record to read in source file `source`. The Trainer's
loader (`ppo.entry.streaming_trainer`) saves it with each checkpoint, and a resumed run seeks
there instead of reading the trained records again.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator, Optional, Tuple

from paddle.io import IterableDataset

from .base import DataError, RawDataset
from .readers import JSONL_EXTENSIONS, LocalFileDataset, Record, resolve_path
from .specs import parse_dataset_spec

__all__ = ["StreamingDataset", "start_position", "read_lines", "training_dataset"]


def start_position(epoch: int = 0) -> dict:
    """The position of the first record of the first source in `epoch`."""
    return {"epoch": epoch, "source": 0, "offset": 0, "line": 0, "path": None}


def read_lines(path: str, offset: int = 0, line: int = 0) -> Iterator[Tuple[Record, int, int]]:
    """`(record, offset, line)` for each JSON object of the JSON-lines file `path` from byte
    `offset` (just after line `line`) on: the record and the offset / 1-based number of its line
    end. Blank lines are skipped; a line that is not a JSON object is a `DataError` naming it."""
    with open(path, "rb") as f:
        if offset:
            f.seek(offset - 1)
            if f.read(1) != b"\n":
                raise DataError(f"byte {offset} does not start a line: the file changed since the position was saved",
                                path=path)
        for raw in iter(f.readline, b""):
            offset, line = offset + len(raw), line + 1
            try:
                text = raw.decode("utf-8-sig" if line == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"not UTF-8 text ({e.reason}); save the file as UTF-8", path=path, line=line) from None
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path=path, line=line) from None
            if not isinstance(obj, dict):
                raise DataError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line)
            yield Record(obj, path, line), offset, line


def _stream_source(name: str, proportion: float, path: Optional[str], keys: dict) -> LocalFileDataset:
    """A record converter (no records read) of a dataset spec that can be streamed: a local
    JSON-lines file at proportion 1."""
    cls = RawDataset.resolve(name)
    if not (isinstance(cls, type) and issubclass(cls, LocalFileDataset)):
        raise DataError(f"lazy streams local record files; dataset '{name}' is not read from one", field="lazy")
    if proportion != 1:
        raise DataError(f"lazy reads each file whole and in order; dataset '{name}' has proportion {proportion:g} "
                        "(use 1, or lazy false to mix by proportion)", path=path, field="lazy")
    source = cls(path=path, stream=True, **{k: v for k, v in keys.items() if v is not None})
    if os.path.isdir(source.path) or not source.path.lower().endswith(JSONL_EXTENSIONS + (".json",)):
        raise DataError("lazy streams JSON-lines files (.jsonl, or .json holding one object a line); set lazy false "
                        "to read this one", path=source.path, field="lazy")
    with open(source.path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):
        raise DataError("lazy streams JSON lines, and this file is one JSON list; write it one object a line "
                        "or set lazy false", path=source.path, field="lazy")
    return source


class StreamingDataset(IterableDataset):
    """Items of `dataset_class` (a `TokenizedDataset` subclass: same items, collator and
    over-length rules as `dataset_class(datasets, **settings)`) made from the records of the
    JSON-lines files of `datasets` (specs at proportion 1), read in spec order one line at a
    time. The first item is made at construction, so that a missing file, a wrong format or a
    bad first record is reported before any model loads; later bad records stop the run when
    they are reached, naming file and line."""

    def __init__(self, dataset_class: Any, datasets: Any, tokenizer: Any, **settings: Any) -> None:
        super().__init__()
        self.encoder = dataset_class(None, tokenizer=tokenizer, **settings)
        keys = self.encoder.field_key_settings
        self.sources = [_stream_source(name, p, path, keys) for name, p, path in parse_dataset_spec(datasets)]
        self.paths = [s.path for s in self.sources]
        if next(self.items(), None) is None:
            raise DataError(f"{type(self.encoder).__name__} has no samples: no record of the data gives one "
                            f"({self.encoder.stats})", path=", ".join(self.paths))

    @property
    def stats(self) -> dict:
        """Counts of dropped and truncated samples so far (the encoder's)."""
        return self.encoder.stats

    def get_collator(self, *args: Any, **kwargs: Any) -> Any:
        return self.encoder.get_collator(*args, **kwargs)

    def items(self, position: Optional[dict] = None) -> Iterator[Tuple[dict, dict]]:
        """`(item, position after it)` from `position` (default: the start) to the end of the last
        source; a position saved for other files is a `DataError`."""
        position = position or start_position()
        if position["path"] is not None and position["path"] != self.paths[position["source"]]:
            raise DataError(f"the saved stream position is in {position['path']}, this run streams "
                            f"{self.paths[position['source']]}", field="lazy")
        for index in range(position["source"], len(self.sources)):
            source, path = self.sources[index], self.paths[index]
            offset, line = (position["offset"], position["line"]) if index == position["source"] else (0, 0)
            for record, offset, line in read_lines(path, offset, line):
                record.keys = source.field_keys
                item = self.encoder.encode_sample(source.convert(record), lambda: f"{path}, line {record.line}")
                if item is not None:
                    yield item, {"epoch": position["epoch"], "source": index, "offset": offset, "line": line, "path": path}

    def __iter__(self) -> Iterator[dict]:
        for item, _ in self.items():
            yield item


def training_dataset(dataset_class: Any, datasets: Any, lazy: bool = False, **settings: Any) -> Any:
    """The training set of an entry point: `dataset_class(datasets, **settings)`, or with `lazy`
    (PaddleNLP's name) the same items streamed by a `StreamingDataset`."""
    return StreamingDataset(dataset_class, datasets, **settings) if lazy else dataset_class(datasets, **settings)
