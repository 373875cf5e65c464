"""A throughput model of GRPO placements, checked against split runs measured here.

It is then applied to 7B / 70B / 30B-A3B models on 8-64 GPUs (docs/throughput_model.md).

    python scripts/throughput_model.py                           # the GPU table (markdown)
    python scripts/throughput_model.py --validate runs.json      # predicted vs measured split runs

Two parts:
- the schedule (`scripts.split_sim`): N trainer ranks, M rollout replicas, staleness s, each a
  sequence of work and blocking exchanges as the run's code orders them, on `cores` shared cores;
- the costs of one step on GPUs, from the model shapes of `scripts.sizing` (all of them
  assumptions, stated in `Gpu` and `Workload`): training is compute-bound (12 FLOPs per active
  parameter and token: the update with full recompute 8, the reference forward 2, the old
  log-probs 2; attention's FLOPs left out) at `mfu` of the peak; generation is bound by reading
  the weights (the experts the batch reaches, for a mixture of experts) and the KV cache at
  `hbm_efficiency` of the memory bandwidth, or by its FLOPs, whichever is slower, for every decode
  step up to the longest response, plus the prompt's prefill; the weights broadcast sends 2 bytes
  per parameter, each trainer tensor-parallel rank its own slice over its own NIC.

Validation (`--validate`): `bench/async_bench.py --layouts 1+1,2+2,2+1` measures, per layout,
a synchronous and a one-step-off-policy run. The components (one replica generating one trainer
rank's batch, one training step, one broadcast) are taken from the 1+1 synchronous run only;
the schedule then predicts every other run's steps/s on the machine's cores, and the report
gives predicted / measured per run."""
import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts.sizing import MODELS, active_param_count, param_count  # noqa: E402
from scripts.split_sim import SplitRun, simulate  # noqa: E402


@dataclass(frozen=True)
class Gpu:
    """An H100 SXM 80 GB: dense bf16 peak, HBM bandwidth, one NIC per GPU (400 Gb/s), NVLink."""

    peak_flops: float = 989e12
    hbm_bytes_s: float = 3.35e12
    nic_bytes_s: float = 50e9
    nvlink_bytes_s: float = 450e9
    mfu: float = 0.35  # training's share of the peak (dense); a mixture of experts gets `moe_mfu`
    moe_mfu: float = 0.2  # the token exchange and small expert matrices
    hbm_efficiency: float = 0.6  # decode's share of the memory bandwidth
    memory_bytes: float = 80e9


@dataclass(frozen=True)
class Workload:
    """One GRPO step: `prompts` x `samples` responses, `prompt_len` tokens each, responses of
    `response_len` tokens on average and `response_max` at most (a batch decodes until its
    longest)."""

    prompts: int = 256
    samples: int = 8
    prompt_len: int = 1024
    response_len: int = 1024
    response_max: int = 4096

    @property
    def rows(self):
        return self.prompts * self.samples

    @property
    def tokens(self):
        return self.rows * (self.prompt_len + self.response_len)


def _kv_bytes_per_token(shape):
    head_dim = shape.head_dim or shape.hidden // shape.heads
    return 2 * shape.layers * shape.kv_heads * head_dim * 2  # k and v, bf16


def _weights_read(shape, rows):
    """Bytes of weights one decode step of `rows` rows reads: every dense weight, and of each
    sparse layer's experts the expected number that at least one row's top-k reaches."""
    if not shape.experts:
        return 2 * param_count(shape)
    reached = shape.experts * (1 - (1 - shape.top_k / shape.experts) ** rows)
    return 2 * param_count(shape, routed_experts=min(shape.experts, reached))


def train_seconds(model, workload, gpus, gpu=Gpu()):
    """One training step of `workload` on `gpus` GPUs (data, tensor and expert parallel alike)."""
    shape = MODELS[model]
    mfu = gpu.moe_mfu if shape.experts else gpu.mfu
    return 12 * active_param_count(shape) * workload.tokens / (gpus * gpu.peak_flops * mfu)


def live_fraction(workload, step):
    """Share of the rows still decoding at decode step `step`: response lengths with survival
    (1 - step / max) ** (max / mean - 1), the law whose mean is `response_len` and longest
    `response_max`."""
    power = workload.response_max / workload.response_len - 1
    return max(0.0, 1 - step / workload.response_max) ** power


def rows_per_wave(model, prompt_len, response_max, tp, gpu=Gpu()):
    """Rows a replica of `tp` GPUs decodes at once: the engine's static KV cache holds each row's
    `prompt_len + response_max` positions in the memory left by the bf16 weights (90% usable)."""
    shape = MODELS[model]
    budget = 0.9 * tp * gpu.memory_bytes - 2 * param_count(shape)
    return max(0, int(budget // (_kv_bytes_per_token(shape) * (prompt_len + response_max))))


def _wave_seconds(shape, workload, rows, tp, gpu):
    active = active_param_count(shape)
    total = 2 * active * rows * workload.prompt_len / (tp * gpu.peak_flops * gpu.mfu)  # prefill
    chunk = 64  # decode steps per evaluation of the cost (the live rows change slowly)
    for start in range(0, workload.response_max, chunk):
        live = max(1, round(rows * live_fraction(workload, start)))
        read = _weights_read(shape, live) + live * (workload.prompt_len + start) * _kv_bytes_per_token(shape)
        memory_s = read / (tp * gpu.hbm_bytes_s * gpu.hbm_efficiency)
        compute_s = 2 * active * live / (tp * gpu.peak_flops * gpu.mfu)
        total += min(chunk, workload.response_max - start) * max(memory_s, compute_s)
    return total


def generate_seconds(model, workload, rows, tp, gpu=Gpu()):
    """One replica of `tp` GPUs generating `rows` of the workload's responses, in waves of
    `rows_per_wave`: each wave's prompts' prefill, then decode steps up to `response_max` over
    the rows still decoding."""
    wave = rows_per_wave(model, workload.prompt_len, workload.response_max, tp, gpu)
    if wave < 1:
        raise ValueError(f"{model} on {tp} GPUs: no room for one row's KV cache")
    shape, total = MODELS[model], 0.0
    for first in range(0, rows, wave):
        total += _wave_seconds(shape, workload, min(wave, rows - first), tp, gpu)
    return total


def sync_seconds(model, trainer_tp, gpu=Gpu()):
    """One weights broadcast: 2 bytes per parameter, each of the trainer's `trainer_tp` ranks
    sending its slice over its own NIC."""
    return 2 * param_count(MODELS[model]) / (trainer_tp * gpu.nic_bytes_s)


def fits_training(model, gpus, gpu=Gpu()):
    """Whether sharded bf16 AdamW (16 bytes per trained parameter, 2 per reference parameter)
    fits in 75% of `gpus` GPUs' memory."""
    params = param_count(MODELS[model])
    return 18 * params / gpus <= 0.75 * gpu.memory_bytes


def fits_replica(model, workload, tp, gpu=Gpu()):
    """Whether a `tp`-GPU replica holds the bf16 weights and at least 8 rows' KV cache."""
    return rows_per_wave(model, workload.prompt_len, workload.response_max, tp, gpu) >= 8


def colocated_seconds(model, workload, gpus, tp, gpu=Gpu()):
    """A colocated step: every GPU generates (replicas of `tp`), then every GPU trains, with the
    weights gathered over NVLink between them."""
    replicas = gpus // tp
    generate = generate_seconds(model, workload, math.ceil(workload.rows / replicas), tp, gpu)
    reshard = 2 * param_count(MODELS[model]) / gpu.nvlink_bytes_s
    return generate + train_seconds(model, workload, gpus, gpu) + reshard


def split_seconds(model, workload, gpus, rollout_gpus, tp, staleness, gpu=Gpu(), steps=20):
    """A split step (mean over `steps`): `gpus - rollout_gpus` trainer GPUs as data-parallel
    groups of `tp` (trainer ranks of the schedule), `rollout_gpus // tp` replicas of `tp`."""
    trainers, replicas = (gpus - rollout_gpus) // tp, rollout_gpus // tp
    rows = math.ceil(workload.rows / trainers)
    run = SplitRun(trainers, replicas, staleness, steps,
                   gen_s=generate_seconds(model, workload, rows, tp, gpu),
                   train_s=train_seconds(model, workload, gpus - rollout_gpus, gpu),
                   sync_s=sync_seconds(model, tp, gpu))
    return 1 / simulate(run)["steps_per_s"]


def best_split(model, workload, gpus, tp, staleness, gpu=Gpu()):
    """`(rollout GPUs, step seconds)` of the fastest split of `gpus` whose trainer side fits."""
    best = None
    for rollout in range(tp, gpus, tp):
        if not fits_training(model, gpus - rollout, gpu) or (gpus - rollout) % tp:
            continue
        step = split_seconds(model, workload, gpus, rollout, tp, staleness, gpu)
        best = min(best or (rollout, step), (rollout, step), key=lambda pair: pair[1])
    return best


LONG_REASONING = Workload(prompts=128, prompt_len=512, response_len=4096, response_max=16384)
"""Long reasoning responses (docs/throughput_model.md's second case)."""

GPU_CASES = [("Qwen2.5-7B", 8, 1), ("Qwen2.5-7B", 16, 1), ("Llama-2-70B", 32, 8), ("Llama-2-70B", 64, 8),
             ("Qwen3-30B-A3B", 16, 2), ("Qwen3-30B-A3B", 64, 2)]
"""(model, GPUs, the rollout replicas' tensor-parallel degree)."""


def gpu_table(workload=Workload(), gpu=Gpu()):
    """Markdown rows: per case, the colocated step, and the best split at staleness 0 and 1."""
    lines = ["| model | GPUs | colocated step | split, staleness 0 (rollout GPUs) | split, staleness 1 (rollout GPUs) "
             "| staleness 1 / colocated |", "|---|---|---|---|---|---|"]
    for model, gpus, tp in GPU_CASES:
        if not fits_training(model, gpus, gpu) or not fits_replica(model, workload, tp, gpu):
            continue
        coloc = colocated_seconds(model, workload, gpus, tp, gpu)
        (r0, s0), (r1, s1) = (best_split(model, workload, gpus, tp, s, gpu) for s in (0, 1))
        lines.append(f"| {model} | {gpus} | {coloc:.0f} s | {s0:.0f} s ({r0}) | {s1:.0f} s ({r1}) | {coloc / s1:.2f}x |")
    return "\n".join(lines)


def measured_components(run):
    """`(gen_s, train_s, sync_s)` of a measured synchronous 1+1 run (`bench/async_bench.py`'s
    run dict): the trainer waits the whole generation for its batch, then trains, and sends the
    weights once a step."""
    step_s = 1 / run["steps_per_s"]
    return run["rollout_wait_s"], step_s - run["rollout_wait_s"] - run["weights_sync_s"], run["weights_sync_s"]


def validate(bench, background=0.0):
    """Per measured run of `bench` (`bench/async_bench.py --layouts ...`'s JSON): the steps/s the
    schedule predicts from the first seed's 1+1 synchronous run's components on the machine's
    cores (`setup.cpu_count` / `threads_per_process`) beside `background` other busy threads (the
    components' seconds are turned into work at the rate one process had beside them), the
    measured steps/s and their ratio."""
    setup = bench["setup"]
    cores = setup["cpu_count"] / setup["threads_per_process"]
    measured = measured_components(bench["runs"][f"1+1_s0_seed{setup['seeds'][0]}"])
    # the 1+1 synchronous run has one process working at a time: its seconds are work at this rate
    gen, train, sync = (seconds * min(1.0, cores / (1 + background)) for seconds in measured)
    rows = []
    for name, run in sorted(bench["runs"].items()):
        layout, staleness = name.split("_")[0], int(name.split("_")[1][1:])
        trainers, replicas = map(int, layout.split("+"))
        predicted = simulate(SplitRun(trainers, replicas, staleness, run["steps"], gen, train, sync, cores=cores,
                                      background=background))
        rows.append({"run": name, "measured_steps_per_s": run["steps_per_s"],
                     "predicted_steps_per_s": predicted["steps_per_s"],
                     "predicted_over_measured": predicted["steps_per_s"] / run["steps_per_s"]})
    return {"components_s": {"gen": gen, "train": train, "sync": sync}, "cores": cores, "background": background,
            "runs": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--validate", help="bench/async_bench.py's JSON with --layouts: predicted against measured")
    parser.add_argument("--background", type=float, default=0.0,
                        help="other busy threads on the host while the runs were measured (its load beside them)")
    args = parser.parse_args(argv)
    if args.validate:
        print(json.dumps(validate(json.load(open(args.validate)), args.background), indent=1))
    else:
        print(gpu_table())


if __name__ == "__main__":
    main()
