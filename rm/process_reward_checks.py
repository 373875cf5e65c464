"""Start-up checks of a process-reward-model run (`rm/run_reward.py --process_reward true`):
what the step loss needs and the settings of pairwise reward models it cannot use."""
from ppo.data.process_reward import PRM_DATASET, parse_reward_tokens
from ppo.data.specs import dataset_names

PRM_FIELDS = ("placeholder_token", "reward_tokens")
"""The data settings only a process reward model reads (a run without one refuses values other than their defaults)."""


def changed(args, name):
    """Whether field `name` of the argument dataclass `args` differs from its declared default."""
    return getattr(args, name) != type(args).__dataclass_fields__[name].default


def process_reward_problems(model_args, data_args, training_args):
    """Every problem of `process_reward` with the other arguments (none without it, unless its
    data settings are given)."""
    if not model_args.process_reward:
        return [f"{name} is a process_reward setting; set process_reward true" for name in PRM_FIELDS
                if changed(data_args, name)]
    problems = []
    try:
        parse_reward_tokens(data_args.reward_tokens)
    except ValueError as err:
        problems.append(str(err))
    if not data_args.placeholder_token:
        problems.append("placeholder_token must not be empty")
    refused = [
        (model_args.score_type != "reward", f"score_type {model_args.score_type}: a process reward model is a reward model"),
        (training_args.pipeline_parallel_degree > 1, "pipeline_parallel_degree > 1: the step loss is not implemented for "
                                                     "pipeline stages"),
        (data_args.zero_padding, "zero_padding: packed rows for the step loss are not implemented (PaddleNLP's PRM "
                                 "config trains padded too)"),
        (changed(training_args, "loss_type"), f"loss_type {training_args.loss_type}: the pairwise losses do not "
                                              "apply; the step loss is used"),
        (training_args.regularization != 0, "regularization: the pairwise losses' score regulariser does not apply"),
        (model_args.normalize_score_during_training, "normalize_score_during_training: step scores are logits of the "
                                                     "good-step probability and are not normalised"),
    ]
    problems += [f"process_reward with {why}" for bad, why in refused if bad]
    return problems + process_dataset_problems(data_args)


def process_dataset_problems(data_args):
    """Every train/eval dataset of a process-reward run must carry step labels."""
    from ppo.data import RawDataset, UnknownDatasetError

    problems = []
    for arg in ("train_datasets", "eval_datasets"):
        for name in dataset_names(getattr(data_args, arg)):
            try:
                labelled = getattr(RawDataset.resolve(name), "PROCESS_LABELS", False)
            except UnknownDatasetError:
                continue  # reported when the data loads
            if not labelled:
                problems.append(f"process_reward trains on step-labelled records, but {arg} dataset '{name}' has none: "
                                f"read Math-Shepherd-format files as {PRM_DATASET}:1:PATH")
    return problems
