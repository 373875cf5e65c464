"""The preference-loss registry: one :class:`PreferenceLoss` per ``loss_type``.

Every loss has the call signature ``fn(inputs, hp) -> (loss, stats)``: ``inputs`` a
:class:`PreferenceInputs`, ``hp`` a dict of hyperparameters (missing keys take
:data:`PREFERENCE_HYPERPARAMETERS`' defaults, those of the :class:`Setting` each is declared by in
:data:`PREFERENCE_SETTINGS`). Callers read an entry's facts (its data kind,
whether it needs a reference model, adds its own NLL term, normalises by length, needs KTO's
KL reference point, which hyperparameters it reads) and never branch on a loss name.
Source: verl ``core_algos`` (losses chosen from registries); TRL ``DPOConfig.loss_type``.
"""
from .preference_lists import bco_loss, dro_list_loss, kto_unpaired_loss, lipo_lambda_loss, npo_loss, pro_loss, rrhf_loss
from .preference_pairs import (
    cpo_loss,
    dpo_sigmoid_loss,
    dpop_loss,
    hinge_loss,
    ipo_loss,
    kto_pair_loss,
    kto_paired_loss,
    nca_pair_loss,
    orpo_loss,
    rdpo_loss,
    simpo_loss,
    sppo_hard_loss,
)
from .preference import BETA, DESIRABLE_WEIGHT, UNDESIRABLE_WEIGHT
from .setting import Setting

__all__ = [
    "DATA_KINDS",
    "PREFERENCE_HYPERPARAMETERS",
    "PREFERENCE_SETTINGS",
    "PreferenceInputs",
    "PreferenceLoss",
    "PREFERENCE_LOSSES",
    "get_preference_loss",
    "preference_loss_table",
]

DATA_KINDS = {
    "pairs": "a prompt with a chosen and a rejected answer",
    "lists": "a prompt with k >= 2 answers and their scores (or ranks)",
    "unpaired": "a prompt with one answer labelled desirable or undesirable",
    "rejected": "a prompt with one answer to move away from",
}
"""The record kinds a loss trains on, with what one record holds."""

PREFERENCE_SETTINGS = {
    s.name: s
    for s in (
        BETA,
        Setting("label_smoothing", float, 0.0, "cDPO / robust SimPO: assumed probability that a preference label "
                "is flipped, in [0, 0.5).", bounds=(0.0, True, 0.5, False)),
        Setting("simpo_gamma", float, 0.5, "SimPO target reward margin gamma."),
        Setting("dpop_lambda", float, 50.0, "dpop: weight of the penalty max(0, ref_c - pi_c) (PaddleNLP default 50)."),
        Setting("rdpo_alpha", float, 0.01, "rdpo: alpha in -log s(beta h + alpha (|y_chosen| - |y_rejected|)), "
                "lengths in tokens."),
        DESIRABLE_WEIGHT,
        UNDESIRABLE_WEIGHT,
        Setting("reference_free", bool, False, "sigmoid/ipo/hinge against a uniform reference (log-probs 0): no "
                "reference model."),
    )
}
"""name -> :class:`~ppo.algos.setting.Setting` of every hyperparameter a loss may read: declared
once here; the DPO trainer's argument fields (``dpo.preference_arguments``), their ranges and the
argument reference are generated from these."""
PREFERENCE_HYPERPARAMETERS = {name: s.default for name, s in PREFERENCE_SETTINGS.items()}
"""Hyperparameters a loss may read, with their defaults (those of :data:`PREFERENCE_SETTINGS`)."""


class PreferenceInputs:
    """What a preference loss sees; every tensor ``[B, K]`` (pairs: K = 2, column 0 chosen;
    lists: K answers; unpaired / rejected-only: ``[N, 1]``).

    ``policy``: summed answer log-probs; ``reference``: the reference's (None without one);
    ``lengths``: answer token counts; ``scores``: higher = better (lists), 1 / 0 desirable
    (unpaired), None for pairs; ``valid``: 0 on padding answers of a list (None: all valid);
    ``nll``: scalar token-mean NLL of the best / chosen answers (for losses with an NLL term);
    ``kl_point``: KTO's scalar reference point z0.
    """

    __slots__ = ("policy", "reference", "lengths", "scores", "valid", "nll", "kl_point")

    def __init__(self, policy, reference=None, lengths=None, scores=None, valid=None, nll=None, kl_point=None):
        self.policy, self.reference, self.lengths = policy, reference, lengths
        self.scores, self.valid, self.nll, self.kl_point = scores, valid, nll, kl_point


class PreferenceLoss:
    """One preference loss and the facts its callers need.

    ``data``: a key of :data:`DATA_KINDS`. ``reference``: ``"required"``, ``"optional"``
    (``reference_free`` replaces it by log-probs 0) or ``"none"``. ``nll_term``: the loss
    adds the best answers' NLL itself (``inputs.nll``; ``sft_loss_ratio`` must stay 0).
    ``length_normalised``: log-probs are divided by answer lengths. ``kl_point``: needs
    KTO's reference point from mismatched pairs. ``hyperparameters``: the keys of ``hp`` it
    reads. ``source``: the paper.
    """

    __slots__ = ("name", "fn", "data", "reference", "nll_term", "length_normalised", "kl_point", "hyperparameters", "source")

    def __init__(self, name, fn, data, reference, source, hyperparameters=("beta",), nll_term=False,
                 length_normalised=False, kl_point=False):
        if data not in DATA_KINDS or reference not in ("required", "optional", "none"):
            raise ValueError(f"bad facts for preference loss {name!r}: data={data!r}, reference={reference!r}")
        self.name, self.fn, self.data, self.reference, self.source = name, fn, data, reference, source
        self.hyperparameters = tuple(hyperparameters)
        self.nll_term, self.length_normalised, self.kl_point = bool(nll_term), bool(length_normalised), bool(kl_point)

    def needs_reference(self, reference_free=False):
        """Whether reference log-probs must be computed."""
        return self.reference == "required" or (self.reference == "optional" and not reference_free)

    def __repr__(self):
        return f"PreferenceLoss({self.name!r}, data={self.data!r}, reference={self.reference!r})"

    def __call__(self, inputs, hp=None):
        full = dict(PREFERENCE_HYPERPARAMETERS)
        full.update(hp or {})
        return self.fn(inputs, full)


_OPTIONAL_REF = ("beta", "reference_free")
PREFERENCE_LOSSES = {
    e.name: e
    for e in (
        PreferenceLoss("sigmoid", dpo_sigmoid_loss, "pairs", "optional", "Rafailov et al. 2023 (DPO); cDPO",
                       _OPTIONAL_REF + ("label_smoothing",)),
        PreferenceLoss("ipo", ipo_loss, "pairs", "optional", "Azar et al. 2023 (IPO)", _OPTIONAL_REF, length_normalised=True),
        PreferenceLoss("hinge", hinge_loss, "pairs", "optional", "Zhao et al. 2023 (SLiC)", _OPTIONAL_REF),
        PreferenceLoss("simpo", simpo_loss, "pairs", "none", "Meng et al. 2024 (SimPO)",
                       ("beta", "simpo_gamma", "label_smoothing"), length_normalised=True),
        PreferenceLoss("orpo", orpo_loss, "pairs", "none", "Hong et al. 2024 (ORPO)", nll_term=True, length_normalised=True),
        PreferenceLoss("cpo", cpo_loss, "pairs", "none", "Xu et al. 2024 (CPO)", nll_term=True),
        PreferenceLoss("rdpo", rdpo_loss, "pairs", "required", "Park et al. 2024 (R-DPO)", ("beta", "rdpo_alpha")),
        PreferenceLoss("kto_pair", kto_pair_loss, "pairs", "required", "Ethayarajh et al. 2024 (HALOs eq. 7)"),
        PreferenceLoss("sppo_hard", sppo_hard_loss, "pairs", "required", "Wu et al. 2024 (SPPO)"),
        PreferenceLoss("nca_pair", nca_pair_loss, "pairs", "required", "Chen et al. 2024 (NCA)"),
        PreferenceLoss("dpop", dpop_loss, "pairs", "required", "Pal et al. 2024 (DPO-Positive)", ("beta", "dpop_lambda")),
        PreferenceLoss("kto", kto_paired_loss, "pairs", "required", "Ethayarajh et al. 2024 (KTO), pairs split",
                       ("beta", "desirable_weight", "undesirable_weight"), kl_point=True),
        PreferenceLoss("kto_unpaired", kto_unpaired_loss, "unpaired", "required", "Ethayarajh et al. 2024 (KTO)",
                       ("beta", "desirable_weight", "undesirable_weight"), kl_point=True),
        PreferenceLoss("bco", bco_loss, "unpaired", "required", "Jung et al. 2024 (BCO)"),
        PreferenceLoss("rrhf", rrhf_loss, "lists", "none", "Yuan et al. 2023 (RRHF)", (), nll_term=True, length_normalised=True),
        PreferenceLoss("lipo", lipo_lambda_loss, "lists", "required", "Liu et al. 2024 (LiPO-lambda)"),
        PreferenceLoss("pro", pro_loss, "lists", "none", "Song et al. 2023 (PRO)", (), length_normalised=True),
        PreferenceLoss("dro", dro_list_loss, "lists", "required", "Richemond et al. 2024 (DRO), value per list"),
        PreferenceLoss("npo", npo_loss, "rejected", "required", "Zhang et al. 2024 (NPO)"),
    )
}
"""Every preference loss by ``loss_type``."""


def get_preference_loss(name):
    """The :class:`PreferenceLoss` registered as ``name``; ``ValueError`` naming the choices otherwise."""
    if name not in PREFERENCE_LOSSES:
        raise ValueError(f"Unknown preference loss_type {name!r}; valid choices: {list(PREFERENCE_LOSSES)}")
    return PREFERENCE_LOSSES[name]


def preference_loss_table():
    """The Markdown table of :data:`PREFERENCE_LOSSES` (README's loss table), one row per loss."""
    rows = ["| `loss_type` | data | reference model | own NLL term | length-normalised | hyperparameters | source |",
            "|---|---|---|---|---|---|---|"]
    for e in PREFERENCE_LOSSES.values():
        hps = ", ".join(f"`{h}`" for h in e.hyperparameters) or "-"
        rows.append(f"| `{e.name}` | {e.data} | {e.reference} | {'yes' if e.nll_term else 'no'} | "
                    f"{'yes' if e.length_normalised else 'no'} | {hps} | {e.source} |")
    return "\n".join(rows)
