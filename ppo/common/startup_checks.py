"""The start-up pass of the entry points, before any model loads, and its checks of a tokenizer
against the models it feeds.

`StartupPass` gathers every problem of a run in ONE message: the arguments (unknown keys, bad
values, ranges, combinations, model directories; `argument_parsing.parse_collecting`), then the
steps an entry point runs before loading models (its tokenizer, its datasets built from the data
files, the reward server, the tokenizers against the embeddings), each turned into a problem
instead of stopping the pass. `finish()` raises them together.

A token id at or past the embedding's row count, or a sequence longer than the model's
`max_position_embeddings`, otherwise fails (or silently reads garbage) in the middle of a run,
after the models have loaded and perhaps after hours of training. Both are read here from each
model directory's `config.json` (a LoRA adapter's from its base model).
"""
import json
import logging
import os

from .argument_parsing import parse_collecting
from .argument_problems import ArgumentError, joined_problems
from .process_exit import usage_error_types

logger = logging.getLogger("ppo")


class StartupPass:
    """Every problem found before any model loads, raised together by `finish()`.

        startup = StartupPass()
        model_args, data_args, training_args = startup.parse(classes, argv, validate_arguments)
        tokenizer = startup.attempt(load_tokenizer, model_args.model_name_or_path)
        train = startup.attempt(SupervisedDataset, specs, tokenizer=tokenizer, ...) if tokenizer else None
        startup.add(token_and_position_problems(tokenizer, ...))
        startup.finish()  # ArgumentError listing everything (a lone data error keeps its own type)
    """

    HEADING = "problems stop this run before any model loads"
    """The heading of a message with problems besides the arguments' (data, tokenizers, server)."""

    def __init__(self):
        self.problems = []
        self.errors = []  # the exceptions behind problems, to re-raise a lone one as it is
        self.argument_problems = 0

    def parse(self, dataclass_types, argv=None, validate=None):
        """The parsed argument instances; their problems are kept. Raises at once when the
        arguments could not be built at all (nothing after them could run)."""
        parsed, problems = parse_collecting(dataclass_types, argv, validate)
        self.add(problems)
        self.argument_problems = len(self.problems)
        if parsed is None:
            self.finish()
        return parsed

    def add(self, problems):
        self.problems += [p for p in problems if p]

    def attempt(self, step, *args, **kwargs):
        """`step(*args, **kwargs)`, or None when it raised a usage error or a ValueError (kept as a
        problem). After earlier problems, an unexpected failure is logged at debug level: the
        values it ran on were already refused."""
        try:
            return step(*args, **kwargs)
        except usage_error_types() as error:
            self.problems.append(str(error))
            self.errors.append(error)
        except Exception as error:  # noqa: BLE001 - re-raised unless earlier problems explain it
            if isinstance(error, ValueError) and not self.problems:
                self.problems.append(str(error))
            elif not self.problems:
                raise
            else:
                logger.debug("a start-up step failed on values already refused", exc_info=True)
        return None

    @property
    def failed(self):
        return bool(self.problems)

    def finish(self):
        """Raise every problem found as one ArgumentError (a lone data or argument error is
        re-raised as it is); return when there is none."""
        problems = list(dict.fromkeys(self.problems))
        if not problems:
            return
        if len(problems) == 1 and len(self.errors) == 1:
            raise self.errors[0]
        only_arguments = len(self.problems) == self.argument_problems
        raise ArgumentError(joined_problems(problems) if only_arguments else joined_problems(problems, self.HEADING))


def model_config(path):
    """The `config.json` dict of the model directory `path` (a LoRA adapter's base model's);
    None when it cannot be read here (a model-hub id)."""
    lora = os.path.join(path, "lora_config.json")
    if os.path.isfile(lora):
        with open(lora, encoding="utf-8") as f:
            path = json.load(f).get("base_model_name_or_path") or path
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        return None
    with open(config_file, encoding="utf-8") as f:
        return json.load(f)


def highest_token_id(tokenizer):
    """The largest id the tokenizer can produce: its vocabulary, added and special tokens."""
    ids = list(tokenizer.get_vocab().values())
    ids += [i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
            if isinstance(i, int)]
    return max(ids)


def token_and_position_problems(tokenizer, model_dirs, sequence_length, length_what):
    """Messages for every `(argument name, path)` in `model_dirs` whose model the tokenizer's ids
    overflow (`vocab_size`) or whose positions `sequence_length` tokens overflow
    (`max_position_embeddings`); `length_what` names the arguments that set the length."""
    problems = []
    top = highest_token_id(tokenizer)
    for name, path in model_dirs:
        config = model_config(path) if path and os.path.isdir(path) else None
        if not config:
            continue
        vocab = config.get("vocab_size")
        if isinstance(vocab, int) and top >= vocab:
            problems.append(f"{name}={path}: the tokenizer produces ids up to {top} but the model's embedding has "
                            f"{vocab} rows (vocab_size); resize the embedding or use the model's own tokenizer")
        positions = config.get("max_position_embeddings")
        if isinstance(positions, int) and sequence_length > positions:
            problems.append(f"{name}={path}: sequences of up to {sequence_length} tokens ({length_what}) exceed the "
                            f"model's max_position_embeddings={positions}; shorten them")
    return problems
