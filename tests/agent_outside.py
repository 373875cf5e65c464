"""A user's environment module written OUTSIDE the package (into a test's tmp_path) and a GRPO
run of it through ppo/run_ppo.py, as a user who ports an environment runs it."""
import json
import os
import subprocess
import sys

from tests.test_agent_training import grpo_agent_argv
from tests.test_ppo_trainer import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OUTSIDE_ENV = '''
"""Tools and a scripted tools environment of a user's own module."""
import asyncio
import json
import os
import threading

from ppo.agents import ToolEnvironment, register_tool

_LOCK = threading.Lock()
_RUNNING = [0]


def _log(**row):
    with _LOCK, open(os.environ["OUTSIDE_TOOL_LOG"], "a") as f:
        f.write(json.dumps(row) + "\\n")


@register_tool("lookup", schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]})
def lookup(key):
    _log(tool="lookup", key=key)
    return {"a": "11", "b": "22"}.get(key, "none")


@register_tool("nap", schema={"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
               timeout_s=30)
async def nap(seconds):
    with _LOCK:
        _RUNNING[0] += 1
        running = _RUNNING[0]
    _log(tool="nap", running=running, seconds=seconds)
    try:
        await asyncio.sleep(seconds)
    finally:
        with _LOCK:
            _RUNNING[0] -= 1
    return "ok"


class ScriptEnv(ToolEnvironment):
    """The tools environment with policy turn k replaced by script[k] (a random model writes no calls)."""

    def __init__(self, script, **kwargs):
        super().__init__(**kwargs)
        self.script = list(script)

    def reset(self, record):
        self.turn = 0
        return super().reset(record)

    def step(self, action_text):
        text = self.script[self.turn] if self.turn < len(self.script) else "final answer"
        self.turn += 1
        return super().step(text)
'''


def run_outside(tmp_path, model_dir, data_dir, name, env_kwargs, *extra):
    """ppo/run_ppo.py (one GRPO step, 8 rows) with `user_env.ScriptEnv` from `tmp_path`: (the
    process, its metrics rows, the tools' log rows, the samples.jsonl rows)."""
    (tmp_path / "user_env.py").write_text(OUTSIDE_ENV)
    out, log = tmp_path / name, tmp_path / f"{name}_tools.jsonl"
    argv = grpo_agent_argv(model_dir, data_dir, str(out), "--env_name", "user_env:ScriptEnv", "--env_kwargs",
                           json.dumps(env_kwargs), *extra)
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5", OUTSIDE_TOOL_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(tmp_path), REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "ppo/run_ppo.py", *argv], cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return proc, [], [], []
    tools = [json.loads(line) for line in open(log)] if log.exists() else []
    samples = [json.loads(line) for line in open(out / "samples.jsonl")] if (out / "samples.jsonl").exists() else []
    return proc, read_metrics(str(out)), tools, samples


def agent_row(metrics):
    """The metrics row of the step (the one with the agent counts)."""
    rows = [r for r in metrics if "agent/turns_mean" in r]
    assert len(rows) == 1, metrics
    return rows[0]
