"""Multi-turn, tool-using rollouts: environments, tools, trajectories and the pausing rollout.

    from ppo.agents import AgentSettings, TaggedFormat, rollout_trajectories
    args = AgentSettings(env_name="tools", env_kwargs='{"tools": ["calculator"]}', max_turns=3)
    result = rollout_trajectories(engine, records, args, TaggedFormat(tokenizer, "USER: {input} ASSISTANT:"),
                                  SamplingParams(max_new_tokens=48), seed=0)

- environment.py: the ``Environment`` interface and its registry (``register_environment``,
  ``module.path:Class``); tool_env.py: ``tools``, the tool-calling environment;
- tools.py: the tool registry (``@register_tool``) and ``call_tool``; tool_worker.py: tools in
  worker processes (``tool_isolation`` "process"); tool_limits.py: the cap on concurrent calls,
  the per-call timeout and async tools' event loop; tool_config.py: tools declared in a JSON /
  YAML file; builtin_tools.py: ``calculator``, ``python`` (in ppo/sandbox/), ``search``
  (BM25); tool_calls.py: reading one call; call_formats.py: the registry of call formats
  (hermes, qwen3, qwen3_coder, llama3_json, json_list); tool_runs.py: every call of a turn;
- formats.py: observations as tokens (the chat template's tool slot and tool turn, or the
  tagged form of text templates); trajectory.py: ``Trajectory``/``Segment``, the policy mask
  and the batch layout; rollout.py: the rollout; metrics.py: its counts;
- arguments.py: ``AgentArguments`` (env_name, env_kwargs, max_turns, max_tool_response_len,
  max_total_len, step_timeout_s, turn_reward_mode), the start-up check ``agent_problems``, and
  ``AgentSettings``, the rollout's frozen slice of those fields (``AgentSettings.of(args)``).

The built-in tools and environments register when this package is imported (the registries
in tools.py and environment.py import no entry of their own). docs/agents.md describes the whole.
"""
from . import builtin_tools  # noqa: F401 (registers calculator, python, search)
from . import remote_env  # noqa: F401 (registers remote: an environment served by paddle-align env-server)
from .arguments import AgentArguments, AgentSettings, agent_problems
from .environment import (
    Environment,
    EnvironmentFacts,
    environment_facts,
    environment_problems,
    environment_settings_table,
    get_environment,
    list_environments,
    make_environment,
    register_environment,
)
from .call_formats import CallFormatFacts, call_format_facts, get_call_format, list_call_formats, register_call_format
from .formats import ChatTemplateFormat, TaggedFormat, turn_format_for
from .rollout import AgentRolloutResult, rollout_trajectories
from .tool_env import ToolEnvironment
from .tool_config import load_tool_config
from .tool_limits import set_tool_limits
from .tools import ToolResult, ToolSpec, ToolTimeout, call_tool, get_tool, list_tools, register_tool
from .trajectory import Segment, Trajectory, TrajectoryBatch, collate_trajectories, policy_mask, tokenization_drift

__all__ = [
    "AgentArguments", "AgentSettings", "agent_problems", "Environment", "EnvironmentFacts", "environment_facts", "environment_problems",
    "environment_settings_table",
    "get_environment", "list_environments", "make_environment", "register_environment", "ChatTemplateFormat",
    "TaggedFormat", "turn_format_for", "AgentRolloutResult", "rollout_trajectories", "ToolEnvironment", "ToolResult",
    "ToolSpec", "ToolTimeout", "call_tool", "get_tool", "list_tools", "register_tool", "Segment", "Trajectory",
    "TrajectoryBatch", "collate_trajectories", "policy_mask", "tokenization_drift", "CallFormatFacts",
    "call_format_facts", "get_call_format", "list_call_formats", "register_call_format", "load_tool_config",
    "set_tool_limits",
]
