"""The DPO trainer's objective over the preference-loss registry (`ppo.algos.PREFERENCE_LOSSES`),
and the argument checks that read the registry's facts. Callers (the offline trainer, online
DPO) hand in flat per-answer rows; nothing here branches on a loss name.

Row layout: N = B * K answers, answer-major (row `k * B + b` is answer k of prompt b): a pair
batch is its chosen rows then its rejected rows (K = 2); an unpaired or rejected-only batch
has K = 1.
"""
import paddle

from ppo.algos import PREFERENCE_HYPERPARAMETERS, PREFERENCE_LOSSES, PreferenceInputs, Setting, get_preference_loss, masked_mean

__all__ = ["WEIGHT_SETTINGS", "needs_reference", "loss_argument_problems", "unused_hyperparameters", "positive_answers",
           "preference_objective"]

WEIGHT_SETTINGS = {
    s.name: s
    for s in (
        Setting("sft_loss_ratio", float, 0.0, "Weight of the NLL of the chosen answers (token mean) added to the "
                "preference loss.", bounds=(0.0, True, None, False)),
        Setting("pref_loss_ratio", float, 1.0, "Weight of the preference loss (PaddleNLP: loss = pref_loss_ratio * "
                "pref + sft_loss_ratio * NLL).", bounds=(0.0, True, None, False)),
    )
}
"""name -> `Setting` of the weights of the two terms `preference_objective` adds (PaddleNLP's
names); `dpo.preference_arguments` generates their fields and checks from these."""

SWITCH_HYPERPARAMETERS = ("label_smoothing", "reference_free")
"""Hyperparameters that change what a loss means: set for a loss that does not read them, they
are an error. The others are magnitudes of other losses (PaddleNLP's argument files carry them
for every loss_type): set for a loss that does not read them, they are logged as unused."""


def needs_reference(loss_type, reference_free=False):
    """Whether `loss_type` uses reference log-probs (its registry fact; `reference_free` drops an optional one)."""
    return get_preference_loss(loss_type).needs_reference(reference_free)


def _users(name):
    """The losses that read hyperparameter `name`, comma-separated."""
    return ", ".join(e.name for e in PREFERENCE_LOSSES.values() if name in e.hyperparameters)


def loss_argument_problems(args):
    """Every problem of `args`' preference settings (`loss_type`, the hyperparameters of
    `PREFERENCE_HYPERPARAMETERS`, `sft_loss_ratio`, `pipeline_parallel_degree`) as a list of
    messages; an empty list when they fit the chosen loss's registry facts."""
    try:
        loss = get_preference_loss(args.loss_type)
    except ValueError:
        return [f"loss_type must be one of {tuple(PREFERENCE_LOSSES)}, got {args.loss_type!r}"]
    problems = []
    for name in unused_hyperparameters(args):
        default = PREFERENCE_HYPERPARAMETERS[name]
        if name not in SWITCH_HYPERPARAMETERS:
            continue
        if name == "reference_free" and loss.reference == "required":
            problems.append(f"{loss.name} needs a reference model; reference_free applies to {_users(name)}")
        else:
            problems.append(f"{name} applies to {_users(name)} only, not {loss.name!r} (leave it at {default!r})")
    if loss.nll_term and args.sft_loss_ratio:
        problems.append(f"{loss.name} already includes the NLL of the chosen answers; leave sft_loss_ratio at 0")
    if loss.data == "rejected" and args.sft_loss_ratio:
        problems.append(f"{loss.name} trains on rejected answers only: no chosen answer for sft_loss_ratio; leave it at 0")
    if loss.data != "pairs" and getattr(args, "pipeline_parallel_degree", 1) > 1:
        problems.append(f"{loss.name} trains on {loss.data}; pipeline parallel preference training supports pairs only")
    return problems


def unused_hyperparameters(args):
    """Names of `PREFERENCE_HYPERPARAMETERS` set away from their defaults that `args.loss_type`
    does not read (its registry fact `hyperparameters`)."""
    loss = get_preference_loss(args.loss_type)
    return [name for name, default in PREFERENCE_HYPERPARAMETERS.items()
            if name not in loss.hyperparameters and getattr(args, name, default) != default]


def _first_column(policy, scores, valid):
    return paddle.concat([paddle.ones_like(policy[:, :1]), paddle.zeros_like(policy[:, 1:])], axis=1)


def _best_scored(policy, scores, valid):
    masked = paddle.where(valid.astype("bool"), scores.astype(policy.dtype), paddle.full_like(policy, -1e30))
    return paddle.nn.functional.one_hot(paddle.argmax(masked, axis=-1), policy.shape[1]).astype(policy.dtype)


POSITIVE_ANSWERS = {
    "pairs": _first_column,
    "lists": _best_scored,
    "unpaired": lambda policy, scores, valid: (scores > 0).astype(policy.dtype),
    "rejected": lambda policy, scores, valid: paddle.zeros_like(policy),
}
"""Per data kind: `fn(policy [B, K], scores, valid) -> [B, K]` float, 1 on the chosen / best /
desirable answers (the target of the NLL term and of `logps/chosen`)."""


def positive_answers(data_kind, policy, scores=None, valid=None):
    """`[B, K]` float mask of the chosen / best / desirable answers of a batch of `data_kind`."""
    return POSITIVE_ANSWERS[data_kind](policy, scores, valid)


def preference_objective(args, logps, lengths, ref, kl_point=None, scores=None, valid=None):
    """`(loss, stats)` of `args.loss_type` from flat rows: summed answer log-probs `[N]`, answer
    lengths `[N]`, the reference's log-probs `[N]` (None without one), KTO's KL point (scalar),
    and for lists / unpaired / rejected-only data `scores` and `valid` `[B, K]` (pairs: None).
    Adds `pref_loss_ratio`, the `sft_loss_ratio` NLL of the positive answers (token mean,
    `loss/sft`), `loss/dpo`, `logps/chosen`, `logps/rejected`. Stats are detached scalars."""
    loss_fn = get_preference_loss(args.loss_type)
    B = logps.shape[0] // 2 if scores is None else scores.shape[0]
    K = logps.shape[0] // B

    def grid(v):
        return None if v is None else v.reshape([K, B]).transpose([1, 0])

    policy, answer_lengths = grid(logps), grid(lengths)
    if valid is None:
        valid = paddle.ones_like(policy)
    positive = positive_answers(loss_fn.data, policy, scores, valid)
    nll = -paddle.sum(policy * positive) / paddle.clip(paddle.sum(answer_lengths * positive), min=1e-8)
    inputs = PreferenceInputs(policy, grid(ref), answer_lengths, scores, valid, nll if loss_fn.nll_term else None, kl_point)
    loss, stats = loss_fn(inputs, {name: getattr(args, name, default) for name, default in PREFERENCE_HYPERPARAMETERS.items()})
    stats["loss/dpo"] = loss.detach()
    if args.pref_loss_ratio != 1.0:
        loss = args.pref_loss_ratio * loss  # PaddleNLP's DPOCriterion: pref_loss_ratio * preference loss
    negative = valid.astype(policy.dtype) * (1.0 - positive)
    if loss_fn.data != "rejected":
        stats["logps/chosen"] = masked_mean(policy.detach(), positive)
    stats["logps/rejected"] = masked_mean(policy.detach(), negative)
    if args.sft_loss_ratio > 0:
        loss = loss + args.sft_loss_ratio * nll
        stats["loss/sft"] = nll.detach()
    return loss, stats
