"""Start-up checks of a tokenizer against the models it feeds, before any model loads.

A token id at or past the embedding's row count, or a sequence longer than the model's
`max_position_embeddings`, otherwise fails (or silently reads garbage) in the middle of a run,
after the models have loaded and perhaps after hours of training. Both are read here from each
model directory's `config.json` (a LoRA adapter's from its base model).
"""
import json
import os


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


def check_token_and_position_limits(tokenizer, model_dirs, sequence_length, length_what):
    """Raise one ValueError listing every problem of `token_and_position_problems`."""
    problems = token_and_position_problems(tokenizer, model_dirs, sequence_length, length_what)
    if problems:
        raise ValueError("start-up check failed:\n  " + "\n  ".join(problems))
