"""Tensor parallelism of the families' own classes: Megatron-LM's layout (Shoeybi et al. 2019),
as PaddleNLP's Llama lays it out with fleet's layers.

At ``tensor_parallel_degree`` n > 1 (fleet's model-parallel group of n ranks):

* attention: q/k/v column-parallel (each rank keeps ``num_attention_heads / n`` query heads and
  ``num_key_value_heads / n`` key-value heads, whole heads, so per-head q/k RMSNorm and RoPE
  run unchanged on the rank's heads), o_proj row-parallel (its partial sums all-reduced);
* a SwiGLU MLP (the dense one, each routed expert and the shared experts of a mixture of
  experts): gate/up column-parallel, down row-parallel, i.e. split along the intermediate width;
  the router (and Qwen2-MoE's shared-expert gate) is replicated, so every rank routes the same
  tokens to the same experts;
* the embedding vocabulary-parallel and the LM head split over the vocabulary (``[H, V / n]``
  untied, the embedding's ``[V / n, H]`` tied); the head gathers the logits unless
  ``tensor_parallel_output`` (PaddleNLP's `parallel_matmul`). A vocabulary that n does not
  divide stays whole on every rank (as PaddleNLP's Llama);
* norms and score heads replicated.

`mappings` is the ``_get_tensor_parallel_mappings`` of these classes: PaddleNLP's
`split_or_merge_func` per weight, so `from_pretrained` cuts a one-process checkpoint to this
rank's slices and ``save_pretrained(merge_tensor_parallel=True)`` writes it whole again.
`problems` names every width the degree does not divide (one line each).
"""
from dataclasses import dataclass
from typing import Callable, Optional

import paddle.nn as nn

ATTENTION_COLUMNS = ("q_proj", "k_proj", "v_proj")
SWIGLU_COLUMNS = ("gate_proj", "up_proj")


def degree(config):
    """The config's tensor-parallel degree (1 when unset)."""
    return int(getattr(config, "tensor_parallel_degree", 1) or 1)


def vocab_split(config):
    """Whether the embedding and LM head are split over the vocabulary."""
    n = degree(config)
    return n > 1 and config.vocab_size % n == 0


def _mpu():
    from paddle.distributed.fleet import meta_parallel

    return meta_parallel


def column_linear(config, in_features, out_features, has_bias):
    """``[in, out]`` linear whose output columns are split over the ranks (``gather_output`` off)."""
    if degree(config) > 1:
        return _mpu().ColumnParallelLinear(in_features, out_features, has_bias=has_bias, gather_output=False)
    return nn.Linear(in_features, out_features, bias_attr=None if has_bias else False)


def row_linear(config, in_features, out_features, has_bias):
    """``[in, out]`` linear whose input rows are split (input already split; output all-reduced)."""
    if degree(config) > 1:
        return _mpu().RowParallelLinear(in_features, out_features, has_bias=has_bias, input_is_parallel=True)
    return nn.Linear(in_features, out_features, bias_attr=None if has_bias else False)


def embedding(config):
    """The token embedding ``[V, H]``, vocabulary-parallel where `vocab_split`."""
    if vocab_split(config):
        return _mpu().VocabParallelEmbedding(config.vocab_size, config.hidden_size)
    return nn.Embedding(config.vocab_size, config.hidden_size)


def gradient_all_reduced(x, group):
    """``x`` unchanged forward, its gradient all-reduced over `group` backward (Megatron-LM's
    ``f``): a replicated weight used on a rank's part of the heads gets its whole gradient."""
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops._c_identity(x, group=group)


def parallel_layer_types():
    """Fleet's tensor-parallel layer classes (for weight initialisation)."""
    mpu = _mpu()
    return mpu.ColumnParallelLinear, mpu.RowParallelLinear, mpu.VocabParallelEmbedding


@dataclass
class MoeLayout:
    """Where a mixture-of-experts family's experts sit: ``is_sparse(config, i)`` (layer i has the
    sparse block), the block's shared-expert attribute and its width ``shared_width(config)``."""

    is_sparse: Callable
    shared_name: Optional[str] = None
    shared_width: Optional[Callable] = None


def _widths(config, moe):
    """``(config key, width)`` of everything split by heads or intermediate width."""
    out = [("num_attention_heads", config.num_attention_heads), ("num_key_value_heads", config.num_key_value_heads)]
    layers = range(config.num_hidden_layers)
    if moe is None or any(not moe.is_sparse(config, i) for i in layers):
        out.append(("intermediate_size", config.intermediate_size))
    if moe is not None and any(moe.is_sparse(config, i) for i in layers):
        out.append(("moe_intermediate_size", config.moe_intermediate_size))
        if moe.shared_name and moe.shared_width(config):
            out.append((f"{moe.shared_name} width", moe.shared_width(config)))
    return out


def problems(config, moe=None):
    """One line per width that ``tensor_parallel_degree`` does not divide (empty at degree 1)."""
    n = degree(config)
    if n <= 1:
        return []
    return [f"{key} {width} is not divisible by tensor_parallel_degree {n}" for key, width in _widths(config, moe)
            if width % n]


def projection_biases(config):
    """``(q/k/v biases, biases on the other projections)``."""
    use_bias = bool(getattr(config, "use_bias", False))
    return use_bias or bool(getattr(config, "qkv_bias", False)), use_bias


def _swiglu_kinds(prefix, bias):
    kinds = {f"{prefix}.{name}.weight": True for name in SWIGLU_COLUMNS}
    kinds[f"{prefix}.down_proj.weight"] = False
    if bias:
        kinds.update({f"{prefix}.{name}.bias": True for name in SWIGLU_COLUMNS})
    return kinds


def layer_kinds(config, index, moe=None):
    """``{state-dict key under layers.<index>: is_column}`` of the split weights of one layer."""
    qkv_bias, bias = projection_biases(config)
    at = f"layers.{index}."
    kinds = {f"{at}self_attn.{name}.weight": True for name in ATTENTION_COLUMNS}
    if qkv_bias:
        kinds.update({f"{at}self_attn.{name}.bias": True for name in ATTENTION_COLUMNS})
    kinds[f"{at}self_attn.o_proj.weight"] = False
    if moe is None or not moe.is_sparse(config, index):
        kinds.update(_swiglu_kinds(f"{at}mlp", bias))
        return kinds
    for e in range(config.num_experts):
        kinds.update(_swiglu_kinds(f"{at}mlp.experts.{e}", bias))
    if moe.shared_name and moe.shared_width(config):
        kinds.update(_swiglu_kinds(f"{at}mlp.{moe.shared_name}", bias))
    return kinds


def split_kinds(config, moe=None):
    """``{key: is_column}`` of every split weight of the model (keys without the decoder prefix)."""
    kinds = {}
    if vocab_split(config):
        kinds["embed_tokens.weight"] = False
        kinds["lm_head.weight"] = not config.tie_word_embeddings  # tied: the embedding's [V, H]
    for i in range(config.num_hidden_layers):
        kinds.update(layer_kinds(config, i, moe))
    return kinds


def mappings(config, moe=None, is_split=True):
    """PaddleNLP's ``_get_tensor_parallel_mappings``: ``{key: split (or merge) function}``."""
    from functools import partial

    from paddlenlp.transformers.conversion_utils import split_or_merge_func

    fn = split_or_merge_func(is_split=is_split, tensor_parallel_degree=config.tensor_parallel_degree,
                             tensor_parallel_rank=config.tensor_parallel_rank,
                             num_attention_heads=config.num_attention_heads)
    return {key: partial(fn, is_column=is_column) for key, is_column in split_kinds(config, moe).items()}
