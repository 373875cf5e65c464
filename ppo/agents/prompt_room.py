"""Start-up check of a multi-turn run: does every training prompt leave room under `max_total_len`?

The multi-turn rollout (ppo/agents/rollout.py) starts each trajectory with the environment's
first observation (``env.reset(record)``) formatted by the run's turn format (the tool schemas of
a tool environment included); a prompt of `max_total_len` tokens or more leaves no room for one
answer token and stops the rollout. `prompt_room_problems` builds the same prompts from the
training data before any model loads, for the environment's ``startup_resets`` longest prompts
(by characters; 8 unless its facts say otherwise, 0 for a remote one: a reset may open a sandbox
or a session), and names the longest one when it does not fit (or the record whose ``reset``
raises), on the first rank only. A longer first observation of another record is still caught
by the rollout.
"""
import json
import os

from .environment import environment_facts
from .formats import turn_format_for
from .record_env import close_all, record_choice, record_environment, rollout_record


def first_prompt_lengths(env_for, turn_format, dataset, indices=None):
    """`[(dataset index, tokens)]` of the items `indices` (default: all) of the prompt `dataset` as
    the rollout starts their trajectories, each from the environment `env_for(record)` gives;
    raises ValueError naming the item whose ``env.reset`` raises."""
    lengths = []
    for index in range(len(dataset)) if indices is None else indices:
        item = dataset[index]
        record = rollout_record(item["src"], item["label"], item.get("extra"))
        env = env_for(record)
        try:
            first = env.reset(record)
        except Exception as err:  # noqa: BLE001 - the user's environment: any failure is the problem
            raise ValueError(f"reset() of prompt {index} ({item['src'][:40]!r}) raised {type(err).__name__}: {err}") from None
        segments = turn_format.prompt_segments(first, getattr(env, "tools", None) or ())
        lengths.append((index, sum(len(s.token_ids) for s in segments)))
    return lengths


def prompt_room_problems(args, dataset, tokenizer, datasets_name="train_datasets"):
    """Messages (empty when fine) for a multi-turn run (`args.env_name`) whose longest training
    prompt, as the rollout starts it, leaves no token free under `args.max_total_len`."""
    if not args.env_name or dataset is None or len(dataset) == 0:
        return []
    if int(os.environ.get("PADDLE_TRAINER_ID", "0")) != 0:  # rank 0 checks; the launcher stops the rest when it exits
        return []
    count = environment_facts(args.env_name).startup_resets
    if count <= 0:
        return []
    turn_format = turn_format_for(tokenizer, dataset.use_chat_template, dataset.prompt_template)
    longest_first = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["src"]), reverse=True)
    built = {}

    def env_for(record):  # one environment per distinct (env_name, env_kwargs) of the records
        key = json.dumps(record_choice(args, record), sort_keys=True, default=str)
        if key not in built:
            built[key] = record_environment(args, record)
        return built[key]

    try:
        lengths = first_prompt_lengths(env_for, turn_format, dataset, longest_first[:count])
    except ValueError as err:
        return [f"env_name {args.env_name}: {err}"]
    finally:
        close_all(list(built.values()))
    index, longest = max(lengths, key=lambda pair: pair[1])
    if longest + 1 <= args.max_total_len:
        return []
    src = dataset[index]["src"]
    return [f"max_total_len={args.max_total_len}: prompt {index} of {datasets_name} ({src[:40]!r}) starts its trajectory "
            f"with {longest} tokens (the environment's first observation in the prompt format), leaving no room for an "
            f"answer; set max_total_len above {longest} or shorten the prompts"]
