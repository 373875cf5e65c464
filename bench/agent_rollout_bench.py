"""Multi-turn rollouts with a slow tool: rows paused one by one vs a turn-synchronous loop.

    python bench/agent_rollout_bench.py                  # JSON on stdout
    python bench/agent_rollout_bench.py --reps 5 --slow_factors 1,2

A batch of 16 rows, each 5 policy turns of 32 tokens (every row writes all 32: min_new_tokens =
max_new_tokens), a tool call after each of the first 4 turns. At each call a quarter of the rows
hit a slow tool (rows with row % 4 == call index: every row once), the others a tool that answers
at once. The slow tool's latency is `slow_factor` times the time of one turn (a whole rollout
with instant tools, divided by its 5 turns, measured in this run first), so the result does not
depend on this machine's speed. With latency S and turn time T, a turn-synchronous loop takes
about 5T + 4S and paused rows about 5T + S (each row meets the slow tool once): 1.5x at S = T,
1.86x at S = 2T, before the pausing's own costs (answers prefilled in more, smaller passes;
decode passes over fewer rows while some wait).

Both sides are the same rollout (ppo/agents/rollout.py) on the same engine, kernels, model,
prompts and seeds; only the scheduling differs:
  - paused rows (`pause="row"`, ours): a row waiting for its tool feeds nothing while the
    others keep decoding; its answer is prefilled onto its cache when it is back;
  - turn-synchronous (`pause="batch"`, the baseline): every row waits until the last row of the
    batch has its answer (the slowest tool of the turn), then all go on together.
Each row draws its own uniforms, so both sides sample identical tokens (checked: token_parity).
Runs are interleaved (baseline, ours, ...) after a warm-up; medians of wall time are reported,
tokens/s = policy tokens / wall seconds, ratio = ours / baseline. The model is the random-weight
tiny Llama of bench/rollout_bench.py (4 layers, hidden 256, ~3.2M parameters), with the tool
tags of `ppo.tiny.factory` (`tool_tags=True`).
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import argparse
import json
import statistics
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

BATCH, TURNS, TURN_TOKENS = 16, 5, 32


def bench_env_class():
    from ppo.agents import Environment

    class SlowToolEnv(Environment):
        """Tool call k of row r is slow when r % 4 == k; the final turn ends the episode."""

        stop_strings = []

        def __init__(self, slow_s):
            self.slow_s, self.k = slow_s, 0

        def reset(self, record):
            self.row = record["row"]
            return record["src"]

        def step(self, action_text):
            k, self.k = self.k, self.k + 1
            if self.k >= TURNS:
                return None, 0.0, True, {}
            slow = self.row % 4 == k % 4
            time.sleep(self.slow_s if slow else 0.0)
            call = {"name": "slow" if slow else "fast", "error": None, "timeout": False, "latency_ms": 0.0}
            return f"result {k}: {self.row * 7 + k}", 0.0, False, {"tool_calls": [call]}

    return SlowToolEnv


def build(tmp):
    import paddle

    from ppo.agents import AgentSettings, TaggedFormat
    from ppo.rollout import RolloutEngine, SamplingParams
    from ppo.tiny.factory import build_tiny

    paddle.set_device("cpu")
    tok, model = build_tiny(tmp, seed=0, tool_tags=True, hidden_size=256, num_layers=4, num_heads=4,
                            intermediate_size=688, max_position_embeddings=512)
    model.eval()
    engine = RolloutEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    records = [{"src": f"Reverse: {'abcdefghij'[: 3 + r % 6]}{r}", "row": r} for r in range(BATCH)]
    args = AgentSettings(max_turns=TURNS, max_total_len=512, max_tool_response_len=32)
    params = SamplingParams(max_new_tokens=TURN_TOKENS, min_new_tokens=TURN_TOKENS, temperature=1.0)
    return engine, records, args, TaggedFormat(tok, "USER: {input} ASSISTANT:"), params


def one_turn_seconds(setup):
    """Wall seconds of one turn: a whole rollout with instant tools (every row, every turn, the
    answers' prefill included) divided by the number of turns; median of 3."""
    from ppo.agents import rollout_trajectories

    engine, records, args, fmt, params = setup
    env = bench_env_class()
    times = []
    for _ in range(4):
        start = time.perf_counter()
        rollout_trajectories(engine, records, args, fmt, params, seed=1, env_factory=lambda: env(0.0))
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) / TURNS


def compare(setup, slow_s, reps):
    from ppo.agents import rollout_trajectories

    engine, records, args, fmt, params = setup
    env = bench_env_class()
    walls, tokens = {"batch": [], "row": []}, {}
    for rep in range(reps + 1):
        for pause in ("batch", "row"):
            start = time.perf_counter()
            result = rollout_trajectories(engine, records, args, fmt, params, seed=1, pause=pause,
                                          env_factory=lambda: env(slow_s))
            wall = time.perf_counter() - start
            tokens[pause] = [t.token_ids for t in result.trajectories]
            if rep:  # the first round warms up
                walls[pause].append(wall)
            n_tokens = result.stats["tokens"]
    base, ours = statistics.median(walls["batch"]), statistics.median(walls["row"])
    return {
        "slow_tool_s": round(slow_s, 4), "policy_tokens": n_tokens,
        "turn_synchronous": {"wall_s": round(base, 4), "tokens_per_s": round(n_tokens / base, 1)},
        "paused_rows": {"wall_s": round(ours, 4), "tokens_per_s": round(n_tokens / ours, 1)},
        "ratio": round(base / ours, 3), "token_parity": tokens["batch"] == tokens["row"],
        "walls_s": {k: [round(w, 3) for w in v] for k, v in walls.items()},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description="multi-turn rollouts with a slow tool: paused rows vs turn-synchronous")
    parser.add_argument("--reps", type=int, default=3, help="measured runs per side (after one warm-up)")
    parser.add_argument("--slow_factors", default="1,2", help="slow tool latency in turns of decoding, comma-separated")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        setup = build(tmp)
        turn_s = one_turn_seconds(setup)
        out = {"batch": BATCH, "turns": TURNS, "turn_tokens": TURN_TOKENS, "slow_rows_per_call": BATCH // 4,
               "one_turn_s": round(turn_s, 4), "threads": os.environ.get("OMP_NUM_THREADS", "default"),
               "results": {}}
        for factor in [float(f) for f in args.slow_factors.split(",") if f.strip()]:
            out["results"][f"slow_factor_{factor:g}"] = compare(setup, factor * turn_s, args.reps)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
