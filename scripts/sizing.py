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

Mixtures of experts (`Shape.experts` > 0): every sparse layer has ``experts`` routed SwiGLU
experts ``moe_intermediate`` wide (``shared_intermediate``: the experts every token runs) and a
router ``[h, experts]``; a token runs ``top_k`` of them, so its active parameters
(`active_param_count`) are the dense parts plus ``top_k`` experts per sparse layer. Under
``expert_parallel_degree`` (`ep`) a trained model keeps ``experts / ep`` routed experts per rank
(weights, gradients and AdamW states divided by `ep`, `expert_weights_per_rank`); frozen models
keep all their experts, as `ppo.strategy.expert` does; the rollout gathers the actor's experts
(part of ``rollout_gather``); the token exchange holds the expert group's rows of the one
recomputed layer twice (gathered inputs and the partial outputs, ``2 ep b s h`` bf16 values).
The activation terms are the dense estimate above (the experts' intermediate activations of a
token, ``top_k * moe_intermediate`` wide, are of the dense MLP's order).

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
    head_dim: int = 0  # 0: hidden / heads
    qk_norm: bool = False  # RMSNorm weights on each q and k head (Qwen3)
    experts: int = 0  # routed experts per sparse layer; 0: dense
    top_k: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0  # the shared experts' total width (Qwen2-MoE, ERNIE 4.5 MoE)
    dense_layers: int = 0  # layers with a dense MLP `intermediate` wide instead of experts


MODELS = {  # config.json of each checkpoint
    "Llama-2-7B": Shape(4096, 32, 32, 32, 11008, 32000),
    "Llama-2-13B": Shape(5120, 40, 40, 40, 13824, 32000),
    "Llama-2-70B": Shape(8192, 80, 64, 8, 28672, 32000),
    "Qwen2.5-7B": Shape(3584, 28, 28, 4, 18944, 152064, qkv_bias=True),
    "Qwen2.5-32B": Shape(5120, 64, 40, 8, 27648, 152064, qkv_bias=True),
    "Qwen3-30B-A3B": Shape(2048, 48, 32, 4, 6144, 151936, head_dim=128, qk_norm=True, experts=128, top_k=8,
                           moe_intermediate=768),
    "Mixtral-8x7B": Shape(4096, 32, 32, 8, 14336, 32000, experts=8, top_k=2, moe_intermediate=14336),
}

RECIPES = {  # (trained models, frozen models), each a count of models of the actor's size
    "PPO": (2, 2),  # actor + critic trained; reference + reward model frozen
    "GRPO": (1, 1),  # actor trained; reference frozen; rewards from a server or rules
    "SFT": (1, 0),
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
    ep: int = 1  # expert_parallel_degree: the expert groups are carved out of the data ranks

    @property
    def gpus(self):
        return self.tp * self.sharding * self.ep


LAYOUTS = [
    Layout("PPO", "Llama-2-7B", tp=8, sharding=1, stage=1, micro_batch=2, seq_len=2048),
    Layout("PPO", "Llama-2-13B", tp=8, sharding=2, stage=1, micro_batch=2, seq_len=2048),
    Layout("PPO", "Llama-2-70B", tp=8, sharding=16, stage=3, micro_batch=1, seq_len=2048),
    Layout("GRPO", "Qwen2.5-32B", tp=8, sharding=4, stage=1, micro_batch=2, seq_len=4608),
]
MOE_LAYOUTS = [  # expert parallelism composed with data parallelism (what `ppo.strategy.expert` runs)
    Layout("SFT", "Qwen3-30B-A3B", tp=1, sharding=1, stage=1, micro_batch=1, seq_len=4096, ep=8),
    Layout("SFT", "Qwen3-30B-A3B", tp=1, sharding=1, stage=1, micro_batch=1, seq_len=4096, ep=16),
    Layout("GRPO", "Qwen3-30B-A3B", tp=1, sharding=1, stage=1, micro_batch=1, seq_len=4096, ep=16),
]
PUBLISHED = [
    Layout("PPO", "Llama-2-7B", tp=8, sharding=1, stage=1, micro_batch=2, seq_len=2048),
    Layout("GRPO", "Qwen2.5-7B", tp=4, sharding=2, stage=1, micro_batch=8, seq_len=4608),
]


def _attention(shape):
    hd = shape.head_dim or shape.hidden // shape.heads
    q, kv = shape.heads * hd, shape.kv_heads * hd
    bias = (q + 2 * kv) if shape.qkv_bias else 0
    return shape.hidden * (q + 2 * kv) + q * shape.hidden + bias + (2 * hd if shape.qk_norm else 0)


def _swiglu(shape, width):
    return 3 * shape.hidden * width


def _sparse_layers(shape):
    return shape.layers - shape.dense_layers if shape.experts else 0


def expert_param_count(shape):
    """Parameters of the routed experts of every sparse layer (0 for a dense model)."""
    return _sparse_layers(shape) * shape.experts * _swiglu(shape, shape.moe_intermediate)


def param_count(shape, routed_experts=None):
    """Parameters of a Llama / Qwen / Mixtral / ERNIE-style decoder: embeddings, per layer
    attention (q, k, v, o, Qwen's q/k/v biases and per-head q/k norms), two RMSNorms and a
    SwiGLU MLP (dense layers) or a router, `routed_experts` experts (default all) and the
    shared experts (sparse layers), final norm, LM head unless tied."""
    k = shape.experts if routed_experts is None else routed_experts
    sparse = _sparse_layers(shape)
    common = shape.layers * (_attention(shape) + 2 * shape.hidden)
    dense_mlp = (shape.layers - sparse) * _swiglu(shape, shape.intermediate)
    gate_of_shared = shape.hidden if shape.shared_intermediate else 0  # Qwen2-MoE's sigmoid gate (ERNIE has none)
    moe = sparse * (shape.hidden * shape.experts + k * _swiglu(shape, shape.moe_intermediate)
                    + _swiglu(shape, shape.shared_intermediate) + gate_of_shared)
    embed = shape.vocab * shape.hidden
    return embed + common + dense_mlp + moe + shape.hidden + (0 if shape.tied else embed)


def active_param_count(shape):
    """Parameters one token runs through: `param_count` with ``top_k`` routed experts."""
    return param_count(shape, shape.top_k) if shape.experts else param_count(shape)


def expert_weights_per_rank(shape, ep):
    """Routed expert parameters a trained model keeps per rank under expert parallelism `ep`."""
    if shape.experts % ep:
        raise ValueError(f"expert_parallel_degree {ep} does not divide the {shape.experts} experts")
    return expert_param_count(shape) // ep


def memory_gib(layout):
    """Per-GPU memory parts (GiB) of `layout`: weights, grads, optimizer, frozen, activations,
    train total, and the extra of the engine's gathered actor during the rollout."""
    shape = MODELS[layout.model]
    n = param_count(shape)
    held = n - expert_param_count(shape) + expert_weights_per_rank(shape, layout.ep)  # a trained model per rank
    trained, frozen = RECIPES[layout.recipe]
    tp, sd, stage = layout.tp, layout.sharding, layout.stage
    weights = trained * held * 2 / tp / (sd if stage >= 3 else 1)
    grads = trained * held * 2 / tp / (sd if stage >= 2 else 1)
    optimizer = trained * held * 12 / tp / sd
    frozen_w = frozen * n * 2 / tp
    b, s, h = layout.micro_batch, layout.seq_len, shape.hidden
    activations = shape.layers * b * s * h * 2 + b * s * h * (10 + 24 / tp) + 2 * b * s * shape.vocab / tp * 4
    if layout.ep > 1:
        activations += 2 * layout.ep * b * s * h * 2
    parts = {"weights": weights, "grads": grads, "optimizer": optimizer, "frozen": frozen_w, "activations": activations}
    out = {k: v / GIB for k, v in parts.items()}
    out["train_total"] = sum(out.values())
    out["rollout_gather"] = (n - held / tp) * 2 / GIB  # the slices and experts this rank does not hold
    out["params_b"] = n / 1e9
    out["active_b"] = active_param_count(shape) / 1e9
    out["expert_weights_per_rank_b"] = expert_weights_per_rank(shape, layout.ep) / 1e9
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


def moe_table(layouts=None):
    """The mixture-of-experts table of docs/distributed.md (one row per layout, GiB per GPU)."""
    rows = [
        "| Recipe | Model | Params total / active | Layout (GPUs) | Experts per rank | Weights | Grads | Optimizer | "
        "Frozen models | Activations | Train total | + engine rollout |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lay in layouts or MOE_LAYOUTS:
        m = memory_gib(lay)
        shape = MODELS[lay.model]
        rows.append(
            f"| {lay.recipe} | {lay.model} | {m['params_b']:.2f}B / {m['active_b']:.2f}B | EP {lay.ep} x DP ({lay.gpus}), "
            f"b={lay.micro_batch}, s={lay.seq_len} | {shape.experts // lay.ep} of {shape.experts} "
            f"({m['expert_weights_per_rank_b']:.2f}B) | {m['weights']:.1f} | {m['grads']:.1f} | {m['optimizer']:.1f} | "
            f"{m['frozen']:.1f} | {m['activations']:.1f} | {m['train_total']:.1f} | "
            f"{m['train_total'] + m['rollout_gather']:.1f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
    print()
    print(moe_table())
