"""The policy-loss registry: one :class:`PolicyLoss` per ``policy_loss`` name.

Every entry has one call signature (:meth:`PolicyLoss.__call__`): ``(logprobs, old_logprobs,
advantages, mask, **aggregation, **options, **settings) -> (loss, stats)``, the inputs and
outputs of ``ppo_policy_loss``. ``settings`` are the entry's own arguments (its facts list
them with their defaults); the trainer passes exactly those (:meth:`PolicyLoss.settings_from`
reads them off its arguments), so none is accepted and then ignored. Options shared by
every entry: the rollout-correction weights (``ppo.algos.rollout_correction``) and token
selection by entropy (``top_entropy_frac``). Callers read an entry's facts, never its name.
Source: verl ``core_algos.register_policy_loss`` / ``get_policy_loss_fn`` (registry pattern).
"""
from .covariance_losses import CLIP_COV_SETTINGS, KL_COV_SETTINGS, clip_cov_token_losses, kl_cov_token_losses
from .losses import (CLIP_RANGE_RATIO, CLIP_RANGE_RATIO_HIGH, CLIP_RANGE_RATIO_LOW, DUAL_CLIP, IMPORTANCE_SAMPLING_LEVEL,
                     LOSS_AGG_MODES, _detached, aggregate_loss, ppo_clip_token_losses)
from .masked import _float_mask, _zero_outside, masked_mean, zero_masked_inputs
from .policy_losses import CISPO_SETTINGS, GMPO_SETTINGS, cispo_token_losses, gmpo_token_losses
from .setting import declared_settings
from .token_selection import high_entropy_mask

__all__ = ["POLICY_LOSSES", "PolicyLoss", "TOP_ENTROPY_NORMS", "get_policy_loss", "policy_loss_table"]

TOP_ENTROPY_NORMS = ("kept", "all")
"""``top_entropy_norm``: divide by the kept tokens (the Beyond-the-80/20 authors' code; the default) or by all (TRL)."""

_PPO_CLIP = (CLIP_RANGE_RATIO, CLIP_RANGE_RATIO_LOW, CLIP_RANGE_RATIO_HIGH, DUAL_CLIP)
"""The clip settings of ``ppo_clip``, ``gspo`` and ``clip_cov`` (PaddleNLP's ``clip_range_ratio``)."""
_CISPO, _GMPO, _CLIP_COV, _KL_COV = CISPO_SETTINGS, GMPO_SETTINGS, CLIP_COV_SETTINGS, KL_COV_SETTINGS
"""Each declared beside its loss function (whose defaults are theirs)."""


def _gspo(logprobs, old_logprobs, advantages, mask, **settings):
    return ppo_clip_token_losses(logprobs, old_logprobs, advantages, mask, importance_sampling_level="sequence",
                                 **settings)


class PolicyLoss:
    """One policy loss and the facts its callers need.

    ``fn(logprobs, old_logprobs, advantages, mask, **settings)`` -> ``(token_loss [B, T],
    stats)``. ``settings``: the :class:`~ppo.algos.setting.Setting` of every argument ``fn``
    reads beyond the four tensors (its name, type, default, help and valid values: the argument
    of that name is generated from it), or a dict name -> default of arguments declared
    elsewhere; ``self.settings`` is name -> default, ``self.declared`` the declarations. ``needs_old_logprobs``: the loss reads the old policy's log-probs (a ratio).
    ``sequence_level``: the ratio is per sequence (one value on every token of a row).
    ``loss_agg_mode``: the reduction the method's paper uses (any of ``LOSS_AGG_MODES`` is
    honoured). ``random``: the loss draws random numbers (``uniforms`` makes it
    deterministic). ``source``: the paper; ``compared``: the code its tests compare with.
    """

    __slots__ = ("name", "fn", "settings", "declared", "needs_old_logprobs", "sequence_level", "loss_agg_mode", "random",
                 "source", "compared")

    def __init__(self, name, fn, settings, source, compared, needs_old_logprobs=True, sequence_level=False,
                 loss_agg_mode="token-mean", random=False):
        if loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"bad facts for policy loss {name!r}: loss_agg_mode={loss_agg_mode!r}")
        self.name, self.fn, self.source, self.compared = name, fn, source, compared
        self.settings, self.declared = declared_settings(settings)
        self.needs_old_logprobs, self.sequence_level = bool(needs_old_logprobs), bool(sequence_level)
        self.loss_agg_mode, self.random = loss_agg_mode, bool(random)

    def __repr__(self):
        return f"PolicyLoss({self.name!r}, settings={sorted(self.settings)})"

    def settings_from(self, args):
        """``{name: getattr(args, name)}`` for this entry's settings (e.g. the trainer's arguments)."""
        return {name: getattr(args, name) for name in self.settings}

    def aggregation(self, loss_agg_mode=None):
        """``(mode, why)``: the ``loss_agg_mode`` this loss runs with and the reason, for the
        run's start-up line. ``loss_agg_mode`` set (not None): that mode, the user's choice;
        None: the paper's (``self.loss_agg_mode``; for ``gspo`` the ``seq-mean-token-mean``
        that verl's ``compute_policy_loss_gspo`` forces, for ``gmpo`` the mean over rows of
        verl's ``compute_policy_loss_geo_mean``)."""
        if loss_agg_mode is not None:
            return loss_agg_mode, "loss_agg_mode set in the arguments"
        return self.loss_agg_mode, f"the default of policy_loss {self.name}: its paper's ({self.source})"

    def __call__(self, logprobs, old_logprobs, advantages, mask, loss_agg_mode=None, num_tokens=None,
                 num_seqs=None, loss_scale_factor=None, rollout_is_weights=None, entropy=None, top_entropy_frac=None,
                 top_entropy_norm=TOP_ENTROPY_NORMS[0], uniforms=None, **settings):
        """``(loss, stats)``: the token losses of ``fn``, times the detached ``rollout_is_weights``
        ``[B, T]`` (None: no correction), reduced by ``aggregate_loss(loss_agg_mode, num_tokens,
        num_seqs, loss_scale_factor)`` (``loss_agg_mode`` None: ``self.aggregation()``'s) over
        ``mask``, or with ``top_entropy_frac`` (< 1; ``high_entropy_mask`` of ``entropy``) over
        the kept tokens ``mask * kept`` only.
        ``top_entropy_norm``: ``kept`` divides by the kept tokens only, as the Beyond-the-80/20
        authors' code does (Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR
        ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_vanilla``: ``agg_loss(...,
        loss_mask=response_mask * entropy_top_mask)``), so ``num_tokens`` / ``num_seqs`` count
        kept tokens / rows with a kept token (None: this call's); ``all`` keeps the dropped
        tokens in the normaliser (TRL ``grpo_trainer.py``: ``per_token_loss * entropy_mask``
        over ``completion_mask``), ``num_tokens`` counting every real token.
        Example (token-mean, one row, token losses ``[1, 2, 3, 4]``, the last two kept):
        ``kept`` -> ``(3 + 4) / 2 = 3.5``; ``all`` -> ``(3 + 4) / 4 = 1.75``.
        Stats: ``fn``'s, ``loss/policy_avg``, and ``policy/entropy_kept_frac`` with a selection.
        Unknown settings raise ``ValueError``; missing ones take the defaults."""
        unknown = sorted(set(settings) - set(self.settings))
        if unknown:
            raise ValueError(f"policy_loss {self.name!r} takes no {unknown}; its settings: {sorted(self.settings)}")
        if uniforms is not None and not self.random:
            raise ValueError(f"policy_loss {self.name!r} draws no random numbers; uniforms would be ignored")
        if top_entropy_norm not in TOP_ENTROPY_NORMS:
            raise ValueError(f"top_entropy_norm must be one of {TOP_ENTROPY_NORMS}, got {top_entropy_norm!r}")
        m = _float_mask(mask, logprobs)
        extra = {"uniforms": uniforms} if self.random else {}
        token_loss, stats = self.fn(logprobs, old_logprobs, advantages, m, **{**self.settings, **settings}, **extra)
        agg_mask = m
        if top_entropy_frac is not None and top_entropy_frac != 1.0:
            if entropy is None:
                raise ValueError("top_entropy_frac selects tokens by entropy: pass the per-token entropy")
            kept = high_entropy_mask(entropy, m, top_entropy_frac)
            token_loss = _zero_outside(token_loss, kept)
            agg_mask = m * kept if top_entropy_norm == "kept" else m
            stats["policy/entropy_kept_frac"] = _detached(masked_mean(kept, m))
        if rollout_is_weights is not None:
            (weights,) = zero_masked_inputs(m, rollout_is_weights.detach().astype(token_loss.dtype))
            token_loss = token_loss * weights
        mode = self.aggregation(loss_agg_mode)[0]
        loss = aggregate_loss(token_loss, agg_mask, mode, num_tokens=num_tokens, num_seqs=num_seqs,
                              loss_scale_factor=loss_scale_factor)
        return loss, {"loss/policy_avg": _detached(loss), **stats}


_VERL = "verl core_algos.py"
POLICY_LOSSES = {
    e.name: e
    for e in (
        PolicyLoss("ppo_clip", ppo_clip_token_losses, (*_PPO_CLIP, IMPORTANCE_SAMPLING_LEVEL),
                   "Schulman et al. 2017 (PPO); Yu et al. 2025 (DAPO clip-higher); Ye et al. 2020 (dual clip)",
                   f"{_VERL}:1159 (vanilla); ppo_policy_loss (bit-identical)"),
        PolicyLoss("gspo", _gspo, _PPO_CLIP, "Zheng et al. 2025 (GSPO)",
                   f"{_VERL}:1253; ppo_policy_loss sequence level (bit-identical)", sequence_level=True,
                   loss_agg_mode="seq-mean-token-mean"),
        PolicyLoss("cispo", cispo_token_losses, _CISPO,
                   "MiniMax 2025 (MiniMax-M1, CISPO)", f"{_VERL}:1721; TRL grpo_trainer.py:3080"),
        PolicyLoss("gmpo", gmpo_token_losses, _GMPO,
                   "Zhao et al. 2025 (GMPO)", f"callsys/GMPO train_zero_math_gmpo.py:675; {_VERL}:1635",
                   sequence_level=True, loss_agg_mode="seq-mean-token-mean"),
        PolicyLoss("clip_cov", clip_cov_token_losses,
                   _PPO_CLIP[:3] + _CLIP_COV,
                   "Cui et al. 2025 (Entropy Mechanism, Clip-Cov)",
                   f"PRIME-RL/Entropy-Mechanism-of-RL core_algos.py:469; {_VERL}:1450", random=True),
        PolicyLoss("kl_cov", kl_cov_token_losses, _KL_COV,
                   "Cui et al. 2025 (Entropy Mechanism, KL-Cov)",
                   f"PRIME-RL/Entropy-Mechanism-of-RL core_algos.py:426; {_VERL}:1555"),
    )
}
"""Every policy loss by ``policy_loss`` name."""


def get_policy_loss(name):
    """The :class:`PolicyLoss` registered as ``name``; ``ValueError`` naming the choices otherwise."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"Unknown policy_loss {name!r}; valid choices: {list(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


def policy_loss_table():
    """The Markdown table of :data:`POLICY_LOSSES` (docs/algorithms.md), one row per loss."""
    rows = ["| `policy_loss` | old log-probs | sequence-level | paper's `loss_agg_mode` | settings (defaults) | source "
            "| compared with |", "|---|---|---|---|---|---|---|"]
    for e in POLICY_LOSSES.values():
        settings = ", ".join(f"`{k}={v!r}`" for k, v in e.settings.items()) or "-"
        if e.random:
            settings += " (random: `uniforms`)"
        rows.append(f"| `{e.name}` | {'yes' if e.needs_old_logprobs else 'no'} | {'yes' if e.sequence_level else 'no'} | "
                    f"`{e.loss_agg_mode}` | {settings} | {e.source} | {e.compared} |")
    return "\n".join(rows)
