"""A multi-turn run's `max_total_len` is checked in the start-up pass, before any model loads: above
the model's `max_position_embeddings` (read from its `config.json`), or too small for a training
prompt as the rollout starts its trajectory (the environment's first observation in the prompt
format): one line naming the key, exit status 2, no traceback."""
import json
import os
import re
import subprocess
import sys

import pytest

from ppo.agents import AgentArguments
from ppo.agents.environment import make_environment
from ppo.agents.formats import turn_format_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_LOADED = "Loading weights file"


def run_agent_config(tmp_path, model_dir, data_dir, *flags):
    config = json.load(open(os.path.join(ROOT, "config/tiny/grpo_agent_argument.json")))
    config.update(actor_model_name_or_path=model_dir, train_datasets=f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
                  output_dir=str(tmp_path / "out"), logging_dir=str(tmp_path / "out" / "vdl"))
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    return subprocess.run([sys.executable, "ppo/run_ppo.py", str(path), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)


def refusal(done, tmp_path):
    """The one error line of a refused run (asserting exit 2, no traceback, no model loaded, no output)."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout and MODEL_LOADED not in done.stdout + done.stderr
    assert not os.path.exists(tmp_path / "out")
    assert done.stderr.count("error:") == 1, done.stderr[-3000:]  # (log lines of the data may come before it)
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_max_total_len_beyond_the_models_positions_is_refused_at_start(tiny_model_dir, tiny_data_dir, tmp_path):
    positions = json.load(open(os.path.join(tiny_model_dir, "config.json")))["max_position_embeddings"]
    done = run_agent_config(tmp_path, tiny_model_dir, tiny_data_dir, "--max_total_len", str(positions + 72))
    assert refusal(done, tmp_path) == (
        f"run_ppo.py: error: actor_model_name_or_path={tiny_model_dir}: sequences of up to {positions + 72} tokens "
        f"(max_total_len) exceed the model's max_position_embeddings={positions}; shorten them")


def test_max_total_len_below_a_prompt_is_refused_at_start(tiny_model_dir, tiny_data_dir, tmp_path):
    done = run_agent_config(tmp_path, tiny_model_dir, tiny_data_dir, "--max_total_len", "10")
    line = refusal(done, tmp_path)
    found = re.fullmatch(r"run_ppo\.py: error: max_total_len=10: prompt (\d+) of train_datasets \((.*)\) starts its "
                         r"trajectory with (\d+) tokens \(the environment's first observation in the prompt format\), "
                         r"leaving no room for an answer; set max_total_len above \3 or shorten the prompts", line)
    assert found, line
    assert int(found.group(3)) >= 10


@pytest.fixture(scope="module")
def agent_prompts(tiny_model_dir, tiny_data_dir):
    from ppo.data import PromptOnlyDataset
    from ppo.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    dataset = PromptOnlyDataset([f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl"], tokenizer, max_prompt_len=24,
                                prompt_template="USER: {input} ASSISTANT:")
    return tokenizer, dataset


def test_the_longest_prompt_decides_at_the_boundary(agent_prompts):
    from ppo.agents.prompt_room import first_prompt_lengths, prompt_room_problems

    tokenizer, dataset = agent_prompts
    args = AgentArguments(env_name="tools", env_kwargs='{"tools": ["calculator"]}', max_total_len=64)
    env = make_environment("tools", {"tools": ["calculator"]})
    lengths = first_prompt_lengths(lambda record: env, turn_format_for(tokenizer, False, "USER: {input} ASSISTANT:"),
                                   dataset)
    assert len(lengths) == len(dataset)
    index, longest = max(lengths, key=lambda pair: pair[1])
    first = env.reset({"src": dataset[index]["src"], "tgt": dataset[index]["label"]})
    text = "USER: " + (first if isinstance(first, str) else first[-1]["content"])
    assert longest >= len(tokenizer(text, add_special_tokens=False)["input_ids"])  # the template's words and more
    args.max_total_len = longest + 1  # room for one answer token
    assert prompt_room_problems(args, dataset, tokenizer) == []
    args.max_total_len = longest
    assert len(prompt_room_problems(args, dataset, tokenizer)) == 1


class ResetFails:
    tools = []

    def reset(self, record):
        raise KeyError("question")

    def step(self, text):
        return None, 0.0, True, {}


def test_an_environment_whose_reset_raises_is_named(agent_prompts):
    from ppo.agents.prompt_room import prompt_room_problems

    tokenizer, dataset = agent_prompts
    args = AgentArguments(env_name="tests.test_max_total_len_checks:ResetFails", max_total_len=64)
    first = max(range(len(dataset)), key=lambda i: len(dataset[i]["src"]))  # the check starts the longest first
    assert prompt_room_problems(args, dataset, tokenizer) == [
        f"env_name tests.test_max_total_len_checks:ResetFails: reset() of prompt {first} ({dataset[first]['src'][:40]!r}) raised "
        "KeyError: 'question'"]
