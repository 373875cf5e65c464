"""Start-up check of a multi-turn run: does every training prompt leave room under `max_total_len`?

The multi-turn rollout (ppo/agents/rollout.py) starts each trajectory with the environment's
first observation (``env.reset(record)``) formatted by the run's turn format (the tool schemas of
a tool environment included); a prompt of `max_total_len` tokens or more leaves no room for one
answer token and stops the rollout. `prompt_room_problems` builds the same prompts from the
training data before any model loads, with one instance of the environment, and names the
longest one when it does not fit (or the record whose ``reset`` raises). Each record is reset as
the rollout resets it: with its own fields, in its own environment (ppo/agents/record_env.py).
"""
import json

from .environment import make_environment
from .formats import turn_format_for
from .record_env import close_all, record_choice


def item_record(item):
    """The record a prompt item's trajectory starts from: its own fields, `src` and `tgt`."""
    return {**(item.get("extra") or {}), "src": item["src"], "tgt": item["label"]}


def first_prompt_lengths(env, turn_format, dataset, env_for=None):
    """`[(dataset index, tokens)]` of every item of the prompt `dataset` as the rollout starts its
    trajectory, each reset in `env` (or in `env_for(record)`, its own); raises ValueError naming
    the item whose ``reset`` raises."""
    lengths = []
    for index in range(len(dataset)):
        item = dataset[index]
        record = item_record(item)
        record_env = env_for(record) if env_for is not None else env
        try:
            first = record_env.reset(record)
        except Exception as err:  # noqa: BLE001 - the user's environment: any failure is the problem
            raise ValueError(f"reset() of prompt {index} ({item['src'][:40]!r}) raised {type(err).__name__}: {err}") from None
        segments = turn_format.prompt_segments(first, getattr(record_env, "tools", None) or ())
        lengths.append((index, sum(len(s.token_ids) for s in segments)))
    return lengths


def prompt_room_problems(args, dataset, tokenizer, datasets_name="train_datasets"):
    """Messages (empty when fine) for a multi-turn run (`args.env_name`) whose longest training
    prompt, as the rollout starts it, leaves no token free under `args.max_total_len`."""
    if not args.env_name or dataset is None or len(dataset) == 0:
        return []
    turn_format = turn_format_for(tokenizer, dataset.use_chat_template, dataset.prompt_template)
    envs = {}

    def env_for(record):  # one instance per distinct (environment, arguments) of the records
        name, kwargs = record_choice(args, record)
        key = (name, json.dumps(kwargs, sort_keys=True, default=str))
        if key not in envs:
            envs[key] = make_environment(name, kwargs)
        return envs[key]

    try:
        lengths = first_prompt_lengths(None, turn_format, dataset, env_for)
    except ValueError as err:
        return [f"env_name {args.env_name}: {err}"]
    finally:
        close_all(envs.values())
    index, longest = max(lengths, key=lambda pair: pair[1])
    if longest + 1 <= args.max_total_len:
        return []
    src = dataset[index]["src"]
    return [f"max_total_len={args.max_total_len}: prompt {index} of {datasets_name} ({src[:40]!r}) starts its trajectory "
            f"with {longest} tokens (the environment's first observation in the prompt format), leaving no room for an "
            f"answer; set max_total_len above {longest} or shorten the prompts"]
