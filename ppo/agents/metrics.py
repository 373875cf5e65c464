"""The counts of a multi-turn rollout, as the metrics dict the rollout returns.

- ``agent/turns_mean``: policy turns per trajectory; ``agent/tool_calls_mean``: calls per
  trajectory (malformed and unknown ones included); ``agent/truncated_frac``: trajectories cut
  by ``max_turns`` or ``max_total_len``;
- ``agent/malformed_calls``, ``agent/unknown_tool_calls``: calls that named no runnable tool;
  ``agent/env_errors``: episodes ended because the environment raised or did not answer;
  ``agent/too_many_calls``: calls past ``max_calls_per_turn`` (answered with an error, not run);
  ``agent/trajectory_timeouts``: trajectories ended by ``trajectory_timeout_s``;
- per tool: ``tool/<name>/calls``, ``tool/<name>/errors`` (bad arguments, raised, timed out,
  answer cut), ``tool/<name>/timeouts``, ``tool/<name>/latency_ms`` (mean over its calls).

Counts are sums over the batch; means are over its trajectories (or calls).
"""
from collections import defaultdict


def agent_metrics(trajectories):
    """The metrics dict of `trajectories` (see the module docstring)."""
    n = max(len(trajectories), 1)
    calls = [c for t in trajectories for c in t.tool_calls]
    out = {
        "agent/turns_mean": sum(t.num_turns for t in trajectories) / n,
        "agent/tool_calls_mean": len(calls) / n,
        "agent/truncated_frac": sum(1 for t in trajectories if t.truncated) / n,
        "agent/malformed_calls": float(sum(1 for c in calls if c.get("error") == "malformed")),
        "agent/unknown_tool_calls": float(sum(1 for c in calls if c.get("error") == "unknown_tool")),
        "agent/env_errors": float(sum(1 for t in trajectories if t.stop_reason in ("env_error", "env_timeout"))),
        "agent/too_many_calls": float(sum(1 for c in calls if c.get("error") == "too_many_calls")),
        "agent/trajectory_timeouts": float(sum(1 for t in trajectories if t.stop_reason == "trajectory_timeout")),
    }
    per_tool = defaultdict(list)
    for c in calls:
        if c.get("name") and c.get("error") not in ("malformed", "unknown_tool", "too_many_calls"):
            per_tool[c["name"]].append(c)
    for name, items in sorted(per_tool.items()):
        out[f"tool/{name}/calls"] = float(len(items))
        out[f"tool/{name}/errors"] = float(sum(1 for c in items if c.get("error")))
        out[f"tool/{name}/timeouts"] = float(sum(1 for c in items if c.get("timeout")))
        out[f"tool/{name}/latency_ms"] = sum(float(c.get("latency_ms", 0.0)) for c in items) / len(items)
    return out
