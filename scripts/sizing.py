"""Memory per GPU of PPO / GRPO layouts, from the model shapes (the sizing table of docs/distributed.md).

    python scripts/sizing.py            # prints the markdown table docs/distributed.md holds

Per GPU, in GiB, for bf16 mixed-precision AdamW (ZeRO's accounting, Rajbhandari et al.
2020): a trained model costs 2 bytes of bf16 weights + 2 of bf16 gradients + 12 of fp32
master weights and Adam moments per parameter; a frozen model (reference, reward) 2.

* tensor parallelism (`tp`) divides every model's weights by `tp` (norms are replicated:
  they are a rounding error here);
* sharding over `sd` ranks divides the optimizer states (stage 1), also the gradients
  (stage 2), also the trained weights (stage 3); frozen models are not sharded;
* activations of the update pass with full recompute and flash attention (Korthikanti et
  al. 2022, "Reducing Activation Recomputation"): the checkpointed layer inputs, `L * b * s
  * h * 2` bytes, plus one layer recomputed, `b * s * h * (10 + 24 / tp)` bytes, plus the
  float32 logits of the vocabulary slice kept for the backward pass, `2 * b * s * V / tp * 4`
  bytes (`b` micro-batch, `s` sequence length). One model runs its backward at a time;
* rollout: the rollout engine gathers the whole actor on every rank (`bf16`, not divided
  by `tp`) for generation; PaddleNLP `generate` (`use_fusemt false`) keeps the slices.

The layouts in `LAYOUTS` are the ones docs/distributed.md recommends; `PUBLISHED` are PaddleNLP's own
configs (`llm/config/llama/ppo_argument.json`: PPO Llama 7B with TP 8;
`llm/config/qwen/grpo_argument.json`: GRPO Qwen2.5-7B with TP 4 x sharding stage 1 over 2).
"""
from dataclasses import dataclass

GIB = 1024 ** 3
GPU_GIB = 80  # A100 / H100 80 GB


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False


MODELS = {  # config.json of each checkpoint
    "Llama-2-7B": Shape(4096, 32, 32, 32, 11008, 32000),
    "Llama-2-13B": Shape(5120, 40, 40, 40, 13824, 32000),
    "Llama-2-70B": Shape(8192, 80, 64, 8, 28672, 32000),
    "Qwen2.5-7B": Shape(3584, 28, 28, 4, 18944, 152064, qkv_bias=True),
    "Qwen2.5-32B": Shape(5120, 64, 40, 8, 27648, 152064, qkv_bias=True),
}

RECIPES = {  # (trained models, frozen models), each a count of models of the actor's size
    "PPO": (2, 2),  # actor + critic trained; reference + reward model frozen
    "GRPO": (1, 1),  # actor trained; reference frozen; rewards from a server or rules
}


@dataclass(frozen=True)
class Layout:
    recipe: str
    model: str
    tp: int
    sharding: int
    stage: int
    micro_batch: int
    seq_len: int

    @property
    def gpus(self):
        return self.tp * self.sharding


LAYOUTS = [
    Layout("PPO", "Llama-2-7B", tp=8, sharding=1, stage=1, micro_batch=2, seq_len=2048),
    Layout("PPO", "Llama-2-13B", tp=8, sharding=2, stage=1, micro_batch=2, seq_len=2048),
    Layout("PPO", "Llama-2-70B", tp=8, sharding=16, stage=3, micro_batch=1, seq_len=2048),
    Layout("GRPO", "Qwen2.5-32B", tp=8, sharding=4, stage=1, micro_batch=2, seq_len=4608),
]
PUBLISHED = [
    Layout("PPO", "Llama-2-7B", tp=8, sharding=1, stage=1, micro_batch=2, seq_len=2048),
    Layout("GRPO", "Qwen2.5-7B", tp=4, sharding=2, stage=1, micro_batch=8, seq_len=4608),
]


def param_count(shape):
    """Parameters of a Llama / Qwen2 decoder: embeddings, per layer attention (q, k, v, o
    and Qwen's q/k/v biases), SwiGLU MLP and two RMSNorms, final norm, LM head unless tied."""
    hd = shape.hidden // shape.heads
    q, kv = shape.heads * hd, shape.kv_heads * hd
    attn = shape.hidden * (q + 2 * kv) + q * shape.hidden + ((q + 2 * kv) if shape.qkv_bias else 0)
    layer = attn + 3 * shape.hidden * shape.intermediate + 2 * shape.hidden
    embed = shape.vocab * shape.hidden
    return embed + shape.layers * layer + shape.hidden + (0 if shape.tied else embed)


def memory_gib(layout):
    """Per-GPU memory parts (GiB) of `layout`: weights, grads, optimizer, frozen, activations,
    train total, and the extra of the engine's gathered actor during the rollout."""
    shape = MODELS[layout.model]
    n = param_count(shape)
    trained, frozen = RECIPES[layout.recipe]
    tp, sd, stage = layout.tp, layout.sharding, layout.stage
    weights = trained * n * 2 / tp / (sd if stage >= 3 else 1)
    grads = trained * n * 2 / tp / (sd if stage >= 2 else 1)
    optimizer = trained * n * 12 / tp / sd
    frozen_w = frozen * n * 2 / tp
    b, s, h = layout.micro_batch, layout.seq_len, shape.hidden
    activations = shape.layers * b * s * h * 2 + b * s * h * (10 + 24 / tp) + 2 * b * s * shape.vocab / tp * 4
    parts = {"weights": weights, "grads": grads, "optimizer": optimizer, "frozen": frozen_w, "activations": activations}
    out = {k: v / GIB for k, v in parts.items()}
    out["train_total"] = sum(out.values())
    out["rollout_gather"] = n * 2 * (1 - 1 / tp) / GIB  # the slices this rank does not hold
    out["params_b"] = n / 1e9
    return out


def fits(layout, gpu_gib=GPU_GIB):
    m = memory_gib(layout)
    return m["train_total"] <= gpu_gib, m["train_total"] + m["rollout_gather"] <= gpu_gib


def table(layouts=None):
    """The markdown table of docs/distributed.md (one row per layout)."""
    rows = [
        "| Recipe | Model | Params | Layout (GPUs) | Weights | Grads | Optimizer | Frozen models | Activations | "
        "Train total | + engine rollout | Rollout with |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lay in layouts or LAYOUTS:
        m = memory_gib(lay)
        _, engine_fits = fits(lay)
        layout = f"TP {lay.tp} x sharding stage{lay.stage} {lay.sharding} ({lay.gpus}), b={lay.micro_batch}, s={lay.seq_len}"
        rollout = "engine (`use_fusemt`)" if engine_fits else "PaddleNLP generate (`use_fusemt false`)"
        rows.append(
            f"| {lay.recipe} | {lay.model} | {m['params_b']:.2f}B | {layout} | {m['weights']:.1f} | {m['grads']:.1f} | "
            f"{m['optimizer']:.1f} | {m['frozen']:.1f} | {m['activations']:.1f} | {m['train_total']:.1f} | "
            f"{m['train_total'] + m['rollout_gather']:.1f} | {rollout} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
