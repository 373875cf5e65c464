"""The rollout engine's tensor-parallel weights: where a rank's slices sit (`TensorParallelShard`),
whole weights gathered from a tensor-parallel model's slices (`TensorParallelGather`, eval_mode
single), and a whole model cut into this rank's slices (`TensorParallelSlices`: a split run's
rollout replica of `rollout_tensor_parallel_degree` R ranks, each holding the whole weights it
received from the trainer, generates from its slice of them, as PaddleNLP's ReshardController
reshards the trainer's layout to the rollout's degree). `weight_source` picks one for
`ppo.rollout.weights.extract_weights`."""
from dataclasses import dataclass


@dataclass
class TensorParallelShard:
    """Where this rank's slices sit: heads num_heads / R (and kv heads) and the matching
    columns of q/k/v and gate/up, rows of o_proj and down_proj (their products are partial sums,
    all-reduced over `group`), vocabulary rows [vocab_start, vocab_start + V / R) of the
    embedding (ids elsewhere look up zeros; all-reduced), and a vocabulary slice of the LM head
    (logits all-gathered over `group`, in rank order)."""

    group: object
    degree: int
    vocab_start: int
    embed_sharded: bool
    head_sharded: bool


def _bias(linear):
    return getattr(linear, "bias", None)


def split_kind(layer, transpose_y=False, fused_parts=1):
    """How tensor parallelism split `layer`'s weight (a `ppo.models.tensor_slices` kind): "row"
    (axis 0) for a row-parallel linear, a vocabulary-parallel embedding or a tied `[V, H]`
    head; "column" (last axis) for a column-parallel linear or LM head; "column_2fuse" for a
    column-parallel fused gate-up (`fused_parts=2`)."""
    name = type(layer).__name__
    if "RowParallel" in name or "VocabParallel" in name:
        return "row"
    if "ColumnParallel" not in name and transpose_y:
        return "row"
    return "column_2fuse" if fused_parts == 2 else "column"


class TensorParallelGather:
    """Full weights of a tensor-parallel model for the engine, gathered from every rank's slice
    on each call (this rank then runs the whole model for the rollout, as PaddleNLP's
    `eval_mode="single"`; every rank generates the same tokens from the same seed). `group`:
    the model-parallel group the run's strategy names (`tensor_parallel_group` of the engine);
    without tensor parallelism weights pass through."""

    def __init__(self, cfg, group=None, sharded=False):
        self.cfg = cfg
        self.group = group if getattr(cfg, "tensor_parallel_degree", 1) > 1 else None
        if getattr(cfg, "tensor_parallel_degree", 1) > 1 and self.group is None:
            raise RuntimeError("RolloutEngine: the model is tensor-parallel; give the engine its model-parallel group "
                               "(RolloutEngine(tensor_parallel_group=...), the run strategy's generation_group())")
        self.sharded = bool(sharded) and self.group is not None  # keep slices: no gather

    def weight(self, layer, value=None, transpose_y=False, fused_parts=1):
        """`value` (default: `layer.weight`) whole: every rank's slice gathered and merged with
        `ppo.models.parallel_layers.gather_full_weight` when the layer's weight is a slice (`fused_parts=2`: a fused
        gate-up, whose slices hold ``[gate_r, up_r]``)."""
        value = layer.weight if value is None else value
        if self.group is None or self.sharded or not getattr(layer.weight, "is_distributed", False):
            return value
        return self._merged(value, split_kind(layer, transpose_y, fused_parts))

    def bias(self, layer, fused_parts=1):
        b = _bias(layer)
        if b is None or self.group is None or self.sharded or not getattr(b, "is_distributed", False):
            return b
        return self._merged(b, "column_2fuse" if fused_parts == 2 else "column")

    def _merged(self, value, kind):
        from ..models.parallel_layers import gather_full_weight

        return gather_full_weight(value, kind, self.group)

    def shard(self, lm, dec):
        """The `TensorParallelShard` of the kept slices of a tensor-parallel model."""
        emb_w = dec.embed_tokens.weight
        embed_sharded = bool(getattr(emb_w, "is_distributed", False))
        vocab_start = int(self.cfg.tensor_parallel_rank) * int(emb_w.shape[0]) if embed_sharded else 0
        return TensorParallelShard(self.group, int(self.cfg.tensor_parallel_degree), vocab_start, embed_sharded,
                                   bool(getattr(lm.lm_head.weight, "is_distributed", False)))


class TensorParallelSlices:
    """This rank's slices of a whole model's weights over `group` (its rank r of R): each weight
    cut by the kind the model's own tensor-parallel mappings give its name at degree R
    (`ppo.models.tensor_slices.tensor_parallel_kinds`, `split`), so the engine runs the
    sharded path (`TensorParallelShard`) exactly as on a tensor-parallel model of degree R
    loaded from the same weights. `lm`: the whole causal LM."""

    sharded = True

    def __init__(self, lm, group):
        from ..models.tensor_slices import tensor_parallel_kinds

        self.group, self.degree, self.rank = group, group.nranks, group.rank
        named = list(lm.named_parameters())
        kinds = tensor_parallel_kinds(type(lm), lm.config, [n for n, _ in named], degree=self.degree)
        self.kinds = {id(p): kinds[n] for n, p in named}

    def _slice(self, param, value):
        from ..models.tensor_slices import split

        kind = self.kinds.get(id(param), "replicated")
        return value if kind == "replicated" else split(value, kind, self.degree)[self.rank]

    def weight(self, layer, value=None, transpose_y=False, fused_parts=1):
        return self._slice(layer.weight, layer.weight if value is None else value)

    def bias(self, layer, fused_parts=1):
        b = _bias(layer)
        return None if b is None else self._slice(b, b)

    def shard(self, lm, dec):
        emb_w = dec.embed_tokens.weight
        embed_sharded = self.kinds.get(id(emb_w), "replicated") != "replicated"
        vocab_start = self.rank * int(emb_w.shape[0]) // self.degree if embed_sharded else 0
        head_sharded = self.kinds.get(id(lm.lm_head.weight), "replicated") != "replicated"
        return TensorParallelShard(self.group, self.degree, vocab_start, embed_sharded, head_sharded)


def weight_source(lm, group=None, sharded=False):
    """The engine's view of `lm`'s weights: `TensorParallelSlices` for a whole model given a group
    of several ranks to keep slices over (`sharded`), else `TensorParallelGather`."""
    if sharded and group is not None and group.nranks > 1 and getattr(lm.config, "tensor_parallel_degree", 1) <= 1:
        return TensorParallelSlices(lm, group)
    return TensorParallelGather(lm.config, group=group, sharded=sharded)


def sharded_heads(lm, dec, tp, nh, nkv, cols):
    """With `tp.sharded` (tensor-parallel slices kept): `(TensorParallelShard, heads per rank,
    kv heads per rank)`; else `(None, nh, nkv)`."""
    if not tp.sharded:
        return None, nh, nkv
    if cols:
        raise ValueError("sharded tensor-parallel weights use the 'rows' layout")
    shard = tp.shard(lm, dec)
    if nh % shard.degree or nkv % shard.degree:
        raise ValueError(f"eval_mode tensor_parallel: {nh} heads / {nkv} kv heads do not split over {shard.degree} ranks")
    return shard, nh // shard.degree, nkv // shard.degree
