"""Pipeline classes of the dense families whose Paddle classes are written here (Qwen3, ERNIE 4.5;
`ppo.models.families`), built as PaddleNLP 3.0.0b4 builds `LlamaForCausalLMPipe`: a
`PipelinePretrainedModel` / fleet `PipelineLayer` of the embedding, the decoder layers, the
final norm and the LM head, each a layer of the sequence that fleet cuts into stages.

Between layers travel ``(hidden [B, T, H], additive mask [B, 1, T, T], position_ids [B, T])``;
the first layer takes ``(input_ids, mask [B, T] (bool or int), position_ids)`` (or the ids
alone) and builds the mask as the plain decoder does (`decoder.decoder_forward`). Every layer
is the plain model's own (`decoder.DecoderLayer`, `RMSNorm`, `LMHead`, the tensor-parallel
embedding), named by the plain model's keys (``qwen3.embed_tokens.weight``,
``qwen3.layers.i.*``, ``qwen3.norm.weight``, ``lm_head.weight``), so a plain checkpoint loads
into the stages and `ppo.strategy.pipeline.pipe.save_pipeline_merged` writes one back.

Tied embeddings (``tie_word_embeddings``): the embedding and the head are one fleet
`SharedLayerDesc` whose head entry has a ``forward_func``. A stage holding both runs the head
with the embedding's own weight (one parameter, as in the plain model); with the head on
another stage, that stage holds a copy ``[V, H]`` named ``lm_head.weight`` (a tied plain
checkpoint has it), set from the first stage's after loading, its gradient summed with the
embedding's after each backward (fleet's `allreduce_shared_weight_gradients`), so both copies
take the same steps; the copy is marked ``is_firstly_shared = False`` so the gradient norm
(fleet's hybrid clip and `ppo.strategy.grad_sync.squared_grad_norm`) counts the tied weight
once. (PaddleNLP's Qwen2 pipe has no ``forward_func``: a stage holding both runs the
embedding on the hidden states.)

Recompute: with ``enable_recompute`` (the Trainer's ``recompute``) and granularity ``full``
each decoder layer is recomputed in backward; ``full_attn`` / ``core_attn`` are the layer's own.
Mixture-of-experts families: a sparse layer is the plain `MoeDecoderLayer`; with
``output_router_logits`` the layers also carry each row's router sums to the last stage, whose
loss adds the router losses of one process (`family_moe_pipe`). A score model carrying them is
refused by name (its head does not take them).
"""
import paddle
import paddle.nn as nn
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer, SharedLayerDesc
from paddle.distributed.fleet.utils import recompute
from paddlenlp.transformers.model_utils import PipelinePretrainedModel
from paddlenlp.transformers.qwen2.modeling import Qwen2Model

from ...models.families import tensor_parallel as tp
from ...models.families.causal_classes import FamilyPretrainedModel
from ...models.families.decoder import DecoderLayer, LMHead, RMSNorm, warn_unimplemented_switches
from ...models.families.moe_classes import MoeDecoderLayer
from .family_moe_pipe import carries_router_sums, real_tokens, router_row_sums, sums_width

SHARED = "family_shared_embedding"


def parse_args(args):
    """``(first, mask, position_ids, router sums)`` of a pipeline layer's input (a tensor or a
    tuple; what it lacks is None)."""
    if not isinstance(args, (tuple, list)):
        return args, None, None, None
    args = tuple(args) + (None,) * (4 - len(args))
    return args[0], args[1], args[2], args[3]


def passed_on(hidden, mask, position_ids, sums=None):
    """The next layer's input; mask and position ids copied (fleet releases a stage's outputs once sent)."""
    out = (hidden, mask.clone(), position_ids.clone())
    return out if sums is None else out + (sums,)


class FamilyEmbeddingPipe(nn.Layer):
    """First layer: ``input_ids [B, T]`` -> hidden ``[B, T, H]``, the additive causal mask
    ``[B, 1, T, T]`` of the ``[B, T]`` mask (all ones when absent) and the position ids
    (``0..T-1`` when absent)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = tp.embedding(config)

    @property
    def embedding_weight(self):
        return self.embed_tokens.weight

    def forward(self, args):
        input_ids, mask, position_ids, _ = parse_args(args)
        hidden = self.embed_tokens(input_ids)
        B, T = input_ids.shape
        if mask is None:
            mask = paddle.ones([B, T], dtype="bool")
        mask = Qwen2Model._prepare_decoder_attention_mask(mask, (B, T), 0, hidden.dtype)
        if position_ids is None:
            position_ids = paddle.arange(T, dtype="int64").expand([B, T])
        mask.stop_gradient, position_ids.stop_gradient = True, True
        if not carries_router_sums(self.config):
            return hidden, mask, position_ids
        return hidden, mask, position_ids, paddle.zeros([B, sums_width(self.config)], dtype="float32")


def run_layer(layer, forward, hidden, mask, position_ids):
    """`forward(hidden, position_ids, mask)` of a decoder layer, recomputed in backward with
    full recompute on; the layer's outputs."""
    if layer.enable_recompute and layer.config.recompute_granularity == "full" and not hidden.stop_gradient:
        return recompute(forward, hidden, position_ids, mask, use_reentrant=layer.config.recompute_use_reentrant)
    return forward(hidden, position_ids, mask)


class FamilyDecoderLayerPipe(DecoderLayer):
    """A plain `DecoderLayer` over the pipeline's ``(hidden, mask, position_ids[, router sums])``."""

    def forward(self, args):
        hidden, mask, position_ids, sums = parse_args(args)
        hidden = run_layer(self, super().forward, hidden, mask, position_ids)[0]
        return passed_on(hidden, mask, position_ids, sums)


class FamilyMoeDecoderLayerPipe(MoeDecoderLayer):
    """A mixture-of-experts `MoeDecoderLayer`; adds its routing to the carried router sums
    (`family_moe_pipe.router_row_sums`)."""

    def forward(self, args):
        hidden, mask, position_ids, sums = parse_args(args)
        hidden, _, logits = run_layer(self, super().forward, hidden, mask, position_ids)
        if sums is not None:
            sums = sums + router_row_sums(logits, real_tokens(mask), self.config)
        return passed_on(hidden, mask, position_ids, sums)


class FamilyNormPipe(nn.Layer):
    """The final RMSNorm: ``(hidden, ...)`` -> normed hidden ``[B, T, H]``; in training with router
    sums, ``(normed hidden, sums)`` (the head passes the sums to the loss)."""

    def __init__(self, config):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, args):
        hidden, _, _, sums = parse_args(args)
        hidden = self.norm(hidden)
        return (hidden, sums) if sums is not None and self.training else hidden


class FamilyLMHeadPipe(LMHead):
    """The untied head ``[H, V]`` (``lm_head.weight``): hidden -> logits ``[B, T, V]``; the router
    sums passed on after them."""

    def forward(self, args):
        if isinstance(args, (tuple, list)):
            return super().forward(args[0]), args[1]
        return super().forward(args)


class TiedLMHeadPipe(nn.Layer):
    """The tied head on a stage without the embedding: its own copy ``[V, H]`` of the embedding
    (``lm_head.weight``; ``[V / n, H]`` when the vocabulary is split over n tensor-parallel ranks)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        split = tp.vocab_split(config)
        vocab = config.vocab_size // tp.degree(config) if split else config.vocab_size
        self.weight = self.create_parameter([vocab, config.hidden_size], dtype=paddle.get_default_dtype())
        if split:
            self.weight.is_distributed, self.weight.split_axis = True, 0

    @property
    def embedding_weight(self):
        return self.weight


def tied_head_forward(layer, hidden):
    """The tied head's ``forward_func``: hidden ``[B, T, H]`` @ the shared layer's ``[V, H]``^T, the
    embedding's own weight on a stage that holds it, else the `TiedLMHeadPipe` copy's; over a
    split vocabulary as `decoder.LMHead` (PaddleNLP's `parallel_matmul`). Router sums after the
    hidden states are passed on after the logits."""
    if isinstance(hidden, (tuple, list)):
        return tied_head_forward(layer, hidden[0]), hidden[1]
    weight = layer.embedding_weight
    if not getattr(weight, "is_distributed", False):
        return paddle.matmul(hidden, weight, transpose_y=True)
    from paddlenlp.transformers.llama.modeling import parallel_matmul

    return parallel_matmul(hidden, weight, transpose_y=True,
                           tensor_parallel_output=bool(getattr(layer.config, "tensor_parallel_output", False)))


class FamilyCausalLMPipe(PipelinePretrainedModel, PipelineLayer):
    """Base of the families' ``<Arch>ForCausalLMPipe`` (`family_pipe_class`): ``PLAIN_PRETRAINED``
    is the family's pretrained class (config class, key prefix, tensor-parallel mappings)."""

    PLAIN_PRETRAINED = None
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb.inv_freq"]
    _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        self.config = config
        hcg = fleet.get_hybrid_communicate_group()
        config.tensor_parallel_degree = max(hcg.get_model_parallel_world_size(), 1)
        config.tensor_parallel_rank = max(hcg.get_model_parallel_rank(), 0)
        problems = tp.problems(config, self.PLAIN_PRETRAINED.moe_layout)
        if problems:
            raise ValueError(f"{self.PLAIN_PRETRAINED.family_label}: tensor parallelism: " + "; ".join(problems))
        warn_unimplemented_switches(config, self.PLAIN_PRETRAINED.family_label)
        self.add_pipe_layers(config)
        self.refuse_moe_score_head(config)
        pipe_degree = hcg.topology().get_dim_size("pipe")
        PipelineLayer.__init__(
            self, layers=self.get_sequential_layers(), loss_fn=None, topology=hcg.topology(),
            seg_method="layer:DecoderLayerPipe" if config.num_hidden_layers % pipe_degree == 0 else "uniform",
            recompute_interval=0,
            recompute_ctx={"mp_group": hcg.get_model_parallel_group(), "offload": False, "partition": False},
        )
        self.mark_shared_copies()
        self.apply(self._init_weights)

    def add_pipe_layers(self, config):
        prefix = self.PLAIN_PRETRAINED.base_model_prefix
        tied = config.tie_word_embeddings
        embedding = SharedLayerDesc(SHARED, FamilyEmbeddingPipe, shared_weight_attr="embedding_weight", config=config)
        self.add_sequential_layer(embedding if tied else LayerDesc(FamilyEmbeddingPipe, config=config), prefix)
        moe = self.PLAIN_PRETRAINED.moe_layout
        for i in range(config.num_hidden_layers):
            if moe is not None and moe.is_sparse(config, i):
                block = self.PLAIN_PRETRAINED.moe_block_class
                layer = LayerDesc(FamilyMoeDecoderLayerPipe, config=config, block_class=block)
            else:
                layer = LayerDesc(FamilyDecoderLayerPipe, config=config)
            self.add_sequential_layer(layer, f"{prefix}.layers.{i}")
        self.add_sequential_layer(LayerDesc(FamilyNormPipe, config=config), prefix)
        if tied:
            head = SharedLayerDesc(SHARED, TiedLMHeadPipe, forward_func=tied_head_forward,
                                   shared_weight_attr="embedding_weight", config=config)
        else:
            head = LayerDesc(FamilyLMHeadPipe, config=config)
        self.add_sequential_layer(head, "lm_head")

    def refuse_moe_score_head(self, config):
        """A score model (reward model, critic) of a pipe carrying router sums: refused (its head
        does not take them)."""
        last = self._sequential_layers[-1]["layer"]
        if carries_router_sums(config) and getattr(last, "layer_func", None) is not None \
                and last.layer_func.__name__ == "ScoreHeadPipe":
            raise ValueError(
                f"pipeline_parallel_degree > 1: a score model (reward model, critic) on model_type {config.model_type!r} "
                "(mixture of experts) with output_router_logits true is not implemented; set output_router_logits "
                "false for it, or use tensor_parallel_degree or expert_parallel_degree")

    def mark_shared_copies(self):
        """The tied weight's copy on a later stage: left out of the gradient norm (counted on the first)."""
        for comm in self.shared_comm.values():
            if self.global_rank != min(comm["ranks"]):
                for attr in comm["weight_attr"]:
                    getattr(comm["layer"], attr).is_firstly_shared = False

    @classmethod
    def _load_pretrained_model(cls, model, state_dict, loaded_keys, *args, **kwargs):
        """PaddleNLP's loading; PaddleNLP's own Mixtral names (which the plain class renames) refused."""
        if any(".block_sparse_moe." in key for key in loaded_keys):
            raise ValueError("Mixtral: a checkpoint in PaddleNLP's block_sparse_moe layout is not read by the pipeline "
                             "stages (pipeline_parallel_degree > 1); load and save it once at degree 1 (our names) first")
        return super()._load_pretrained_model(model, state_dict, loaded_keys, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """PaddleNLP's loading, then the tied weight's later-stage copy set from the first stage's
        (a tied checkpoint may lack ``lm_head.weight``); every rank of the pipeline group calls it."""
        model = super().from_pretrained(*args, **kwargs)
        model._synchronize_shared_weights()
        return model


_PIPES = {}


def family_pipe_class(module):
    """``<Arch>ForCausalLMPipe`` of a family module (`ppo.models.families.family_module`)."""
    if module.__name__ not in _PIPES:
        pretrained = module.PRETRAINED_CLASS
        name = f"{module.CAUSAL_LM_CLASS.__name__}Pipe"
        _PIPES[module.__name__] = type(name, (FamilyCausalLMPipe,), {
            "PLAIN_PRETRAINED": pretrained,
            "config_class": module.CONFIG_CLASS,
            "_get_tensor_parallel_mappings": pretrained._get_tensor_parallel_mappings,
            "_init_weights": FamilyPretrainedModel._init_weights,  # a family's own may call super() of its class
            "__doc__": f"{module.CAUSAL_LM_CLASS.__name__} as a pipeline (`FamilyCausalLMPipe`).",
            "__module__": __name__,
        })
    return _PIPES[module.__name__]
