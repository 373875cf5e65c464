"""Score models: a causal-LM backbone plus a linear score head (reward, critic, cost).

`AutoModelForScore.from_pretrained(dir)` builds `<Arch>ModelForScore` for the
directory's `model_type` (llama, qwen2, qwen3), loading the backbone from either a
causal-LM directory (the score head starts random) or a saved score model, in
PaddleNLP's layout. The loaders (`ppo.models.adapters.load_score_model`,
`load_merged_score_model`) also take Hugging Face's (`ppo.models.hf_import`: a one-label
`*ForSequenceClassification` keeps its head).
The score normaliser's statistics are persistable buffers, so a reloaded
model scores identically.

Outputs (`ScoreModelOutput`): `scores [B, T]` one score per token and
`end_scores [B]` at each row's last real token (the largest index where
`attention_mask == 1`, which is right for left and right padding).
"""
from typing import NamedTuple

import paddle
import paddle.nn as nn

from ..algos import pairwise_reward_loss, tokenwise_pairwise_reward_loss
from ..algos.normalizer import build_normalizer
from .causal_lm import last_token_index, position_ids_from_mask

SCORE_TYPES = ("reward", "critic", "cost")
SCORE_CONFIG_DEFAULTS = {
    "score_type": "reward",
    "score_bias": True,
    "do_normalize": False,
    "normalizer_type": None,
    "normalizer_momentum": 0.9,
}


LOSS_TYPES = ("sequence-wise", "token-wise")
"""Pairwise reward-model losses (`loss_type` of rm/run_reward.py)."""


def pair_scores_loss(scores, end_scores, better_ids, worse_ids, better_mask, worse_mask, loss_type, regularization):
    """`(loss, stats)` of B preference pairs scored in one batch: `scores [2B, T]` and
    `end_scores [2B]` with the better rows first, `*_ids`, `*_mask` `[B, T]`. Sequence-wise:
    `ppo.algos.pairwise_reward_loss` of the end scores; token-wise:
    `ppo.algos.tokenwise_pairwise_reward_loss` of the token scores."""
    B = better_ids.shape[0]
    if loss_type == "sequence-wise":
        return pairwise_reward_loss(end_scores[:B], end_scores[B:], regularization=regularization)
    if loss_type == "token-wise":
        return tokenwise_pairwise_reward_loss(
            scores[:B], scores[B:], better_ids, worse_ids, better_mask, worse_mask, regularization=regularization
        )
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


class ScoreModelOutput(NamedTuple):
    """A tuple, so data-parallel wrappers find the tensors that took part in the graph."""

    scores: paddle.Tensor  # [B, T]
    end_scores: paddle.Tensor  # [B]
    end_index: paddle.Tensor  # [B]


class ScoreModelMixin:
    """Shared body of every `<Arch>ModelForScore`; the subclass sets the backbone attribute."""

    def init_score_head(self, config):
        for key, value in SCORE_CONFIG_DEFAULTS.items():
            if not hasattr(config, key) or getattr(config, key) is None and value is not None:
                setattr(config, key, value)
        if config.score_type not in SCORE_TYPES:
            raise ValueError(f"score_type must be one of {SCORE_TYPES}, got {config.score_type!r}")
        self.score_head = nn.Linear(config.hidden_size, 1, bias_attr=None if config.score_bias else False)
        self.register_buffer("normalizer_mean", paddle.zeros([1], dtype="float32"), persistable=True)
        self.register_buffer("normalizer_var", paddle.ones([1], dtype="float32"), persistable=True)
        self.register_buffer("normalizer_count", paddle.zeros([1], dtype="float32"), persistable=True)

    @property
    def backbone(self):
        return getattr(self, self.base_model_prefix)

    # -- normaliser state lives in buffers so that save/load keeps it -------------------------
    def normalizer(self):
        """A normaliser object holding this model's saved statistics (None when disabled)."""
        if not self.config.normalizer_type:
            return None
        kind = self.config.normalizer_type
        kwargs = {"momentum": self.config.normalizer_momentum} if kind == "ExponentialMovingAverage" else {}
        norm = build_normalizer(kind, **kwargs)
        norm.set_state_dict(
            {
                "mean": float(self.normalizer_mean.numpy()[0]),
                "var": float(self.normalizer_var.numpy()[0]),
                "count": float(self.normalizer_count.numpy()[0]),
                "momentum": float(self.config.normalizer_momentum),
            }
        )
        return norm

    def update_normalizer(self, end_scores):
        """Fold a batch of end scores `[B]` into the saved statistics."""
        norm = self.normalizer()
        if norm is None:
            return
        norm.update(end_scores.detach())
        state = norm.state_dict()
        self.normalizer_mean.set_value(paddle.to_tensor([state["mean"]], dtype="float32"))
        self.normalizer_var.set_value(paddle.to_tensor([state["var"]], dtype="float32"))
        self.normalizer_count.set_value(paddle.to_tensor([state["count"]], dtype="float32"))

    def router_losses(self, out, attention_mask):
        """`(weighted router loss or None, stats)` of a mixture-of-experts backbone's output with
        ``output_router_logits`` (`ppo.models.families.moe.moe_losses`, padding excluded), kept on the
        model for the trainer (`ppo.models.families.moe.take_aux_loss`); `(None, {})` otherwise."""
        routers = getattr(out, "router_logits", None)
        if not routers or not getattr(self.config, "output_router_logits", False):
            return None, {}
        from .families.moe import moe_losses

        return moe_losses(routers, self.config, attention_mask if attention_mask.ndim == 2 else None)

    def normalize(self, scores):
        """`(scores - mean) / std` with the saved statistics; identity when disabled."""
        if not (self.config.do_normalize and self.config.normalizer_type):
            return scores
        std = paddle.sqrt(self.normalizer_var + 1e-8)
        return (scores - self.normalizer_mean) / std

    def forward(self, input_ids, attention_mask=None, position_ids=None, ends=None, **kwargs):
        """Per-token and end scores of `input_ids [B, T]`. Packed rows (`ppo.models.unpadded`: a
        `[B, 1, T, T]` mask, position ids given) name each sample's last token as a flat cell
        `ends [S]` of `[B*T]`; `end_scores` and `end_index` are then `[S]`."""
        if attention_mask is None:
            attention_mask = paddle.ones_like(input_ids)
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, return_dict=True
        )
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        self.moe_aux_loss, self.moe_stats = self.router_losses(out, attention_mask)
        scores = self.score_head(hidden).squeeze(-1).astype("float32")  # [B, T]
        if ends is not None:
            end_index = ends if isinstance(ends, paddle.Tensor) else paddle.to_tensor(ends, dtype="int64")
            end_scores = paddle.gather(scores.reshape([-1]), end_index)
        else:
            end_index = last_token_index(attention_mask)
            end_scores = paddle.take_along_axis(scores, end_index.unsqueeze(-1), axis=-1).squeeze(-1)
        if self.training and self.config.normalizer_type:  # statistics always kept, applied if do_normalize
            self.update_normalizer(end_scores)
        return ScoreModelOutput(scores=self.normalize(scores), end_scores=self.normalize(end_scores), end_index=end_index)


def make_score_model_class(pretrained_cls, backbone_cls, name):
    """Build `<Arch>ModelForScore` from a PaddleNLP pretrained base and backbone class."""

    def __init__(self, config):
        pretrained_cls.__init__(self, config)
        setattr(self, pretrained_cls.base_model_prefix, backbone_cls(config))
        self.init_score_head(config)

    attrs = {
        "__init__": __init__,
        "__doc__": f"{backbone_cls.__name__} with a linear score head (reward, critic or cost).",
        "_keys_to_ignore_on_load_unexpected": [r"lm_head", r"rotary_emb.inv_freq"],
        "_keys_to_ignore_on_load_missing": [r"score_head", r"normalizer_"],
    }
    return type(name, (ScoreModelMixin, pretrained_cls), attrs)


def _registry():
    from paddlenlp.transformers import LlamaModel, LlamaPretrainedModel, Qwen2Model, Qwen2PretrainedModel

    from .families import FAMILIES, family_module

    classes = {
        "llama": make_score_model_class(LlamaPretrainedModel, LlamaModel, "LlamaModelForScore"),
        "qwen2": make_score_model_class(Qwen2PretrainedModel, Qwen2Model, "Qwen2ModelForScore"),
    }
    for name, family in FAMILIES.items():
        module = family_module(name)
        if module is not None:
            classes[name] = make_score_model_class(module.PRETRAINED_CLASS, module.BASE_MODEL_CLASS,
                                                   f"{family.causal_lm_arch.replace('ForCausalLM', '')}ModelForScore")
    return classes


_CLASSES = {}


def score_model_class(model_type):
    if not _CLASSES:
        _CLASSES.update(_registry())
    if model_type not in _CLASSES:
        raise ValueError(f"no score model for model_type {model_type!r}; supported: {sorted(_CLASSES)}")
    return _CLASSES[model_type]


def score_config(path, **config_overrides):
    """The model config at `path` with the score-model defaults filled in, then `config_overrides`."""
    from .families import load_config

    config = load_config(path)
    for key, value in SCORE_CONFIG_DEFAULTS.items():
        if getattr(config, key, None) is None:
            setattr(config, key, value)
    for key, value in config_overrides.items():
        setattr(config, key, value)
    return config


class AutoModelForScore:
    """`from_pretrained(path, score_type=..., do_normalize=..., ...)` for any supported backbone."""

    @staticmethod
    def from_pretrained(path, dtype="float32", **config_overrides):
        config = score_config(path, **config_overrides)
        cls = score_model_class(config.model_type)
        return cls.from_pretrained(path, config=config, dtype=dtype)
