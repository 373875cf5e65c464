"""The rollout engine's tensor-parallel weights: where a rank's slices sit (`TensorParallelShard`),
whole weights gathered from a tensor-parallel model's slices (`TensorParallelGather`, eval_mode
single), and a whole model's slices for this rank (`TensorParallelSlices`: a split run's rollout
replica of `rollout_tensor_parallel_degree` R ranks generates from each rank's slice, as
PaddleNLP's ReshardController reshards the trainer's layout to the rollout's degree; each rank
holds only its slices, `hold_slices`, and receives only them at every weight sync).
`weight_source` picks one for `ppo.rollout.weights.extract_weights`."""
from dataclasses import dataclass

import paddle

HELD = "held_tensor_parallel_slices"  # attribute of a model cut by `hold_slices`: (rank, degree)


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
    loaded from the same weights. `lm`: the causal LM, whole, or already cut to rank r's
    slices by `hold_slices` (its parameters are then taken as they are)."""

    sharded = True

    def __init__(self, lm, group):
        from ..models.tensor_slices import tensor_parallel_kinds

        self.group, self.degree, self.rank = group, group.nranks, group.rank
        self.held = getattr(lm, HELD, None) is not None
        if self.held and tuple(getattr(lm, HELD)) != (self.rank, self.degree):
            raise RuntimeError(f"the model holds the slices (rank, degree) {getattr(lm, HELD)}, its group is rank "
                               f"{self.rank} of {self.degree}")
        named = list(lm.named_parameters())
        kinds = tensor_parallel_kinds(type(lm), lm.config, [n for n, _ in named], degree=self.degree)
        self.kinds = {id(p): kinds[n] for n, p in named}

    def _slice(self, param, value):
        from ..models.tensor_slices import split

        kind = self.kinds.get(id(param), "replicated")
        return value if kind == "replicated" or self.held else split(value, kind, self.degree)[self.rank]

    def weight(self, layer, value=None, transpose_y=False, fused_parts=1):
        return self._slice(layer.weight, layer.weight if value is None else value)

    def bias(self, layer, fused_parts=1):
        b = _bias(layer)
        return None if b is None else self._slice(b, b)

    def shard(self, lm, dec):
        emb_w = dec.embed_tokens.weight
        embed_sharded = self.kinds.get(id(emb_w), "replicated") != "replicated"
        rows = int(emb_w.shape[0]) if self.held else int(emb_w.shape[0]) // self.degree  # this rank's vocabulary
        vocab_start = self.rank * rows if embed_sharded else 0
        head_sharded = self.kinds.get(id(lm.lm_head.weight), "replicated") != "replicated"
        return TensorParallelShard(self.group, self.degree, vocab_start, embed_sharded, head_sharded)


def parameter_bytes(params):
    """Bytes of `params` (tensors): the sum of numel x element size."""
    return sum(int(p.numel()) * p.element_size() for p in params)


def replica_kinds(model, degree):
    """The tensor-parallel kind of each of `model.parameters()` (in that order) on a rollout replica
    of `degree` ranks: the model class's own mappings at that degree (`tensor_parallel_kinds`, on
    the names of the one-process layout, whatever `model`'s own degree), each "replicated" at
    degree 1 and for a LoRA model (the adapter's product adds to whole weights, and with a KL its
    disabled adapter is the reference's forward: such a replica keeps its weights whole)."""
    from ..models.basics import unwrap_model
    from ..models.tensor_slices import tensor_parallel_kinds

    base = unwrap_model(model)
    named = list(base.named_parameters())
    if degree <= 1 or any("lora_" in name for name, _ in named):
        return ["replicated"] * len(named)
    kinds = tensor_parallel_kinds(type(base), base.config, [n for n, _ in named], degree=degree)
    return [kinds[n] for n, _ in named]


def hold_slices(model, rank, degree):
    """Cut `model`'s parameters in place to rank `rank`'s slices of `degree` (`replica_kinds`):
    each tensor-parallel parameter keeps its identity and name and now holds a fresh copy of its
    slice (the whole storage freed); replicated ones stay whole. The engine then takes them as
    they are (`TensorParallelSlices`), and `ppo.strategy.rollout_link.RolloutLink.receive_weights`
    fills them with the slices the trainer sends. Returns `(kinds, {"parameter_bytes",
    "whole_parameter_bytes", "tensor_parallel_bytes", "whole_tensor_parallel_bytes"})`."""
    from ..models.basics import unwrap_model
    from ..models.tensor_slices import split

    params, kinds = list(model.parameters()), replica_kinds(model, degree)
    cut = [p for p, kind in zip(params, kinds) if kind != "replicated"]
    sizes = {"whole_parameter_bytes": parameter_bytes(params), "whole_tensor_parallel_bytes": parameter_bytes(cut)}
    with paddle.no_grad():
        for p, kind in zip(params, kinds):
            if kind != "replicated":
                piece = split(p, kind, degree)[rank].clone()
                target = p.value().get_tensor()
                target._clear()
                target._share_data_with(piece.value().get_tensor())
    if cut:
        setattr(unwrap_model(model), HELD, (rank, degree))
    sizes.update(parameter_bytes=parameter_bytes(params), tensor_parallel_bytes=parameter_bytes(cut))
    return kinds, sizes


def weight_source(lm, group=None, sharded=False):
    """The engine's view of `lm`'s weights: `TensorParallelSlices` for a whole model given a group
    of several ranks to keep slices over (`sharded`), else `TensorParallelGather`."""
    if sharded and group is not None and group.nranks > 1 and getattr(lm.config, "tensor_parallel_degree", 1) <= 1:
        return TensorParallelSlices(lm, group)
    if getattr(lm, HELD, None) is not None:
        raise RuntimeError(f"the model holds only the tensor-parallel slices {getattr(lm, HELD)} (rank, degree): "
                           "generate from them with keep_tensor_parallel and the replica's group")
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
