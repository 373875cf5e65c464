"""Argument refusals of tensor parallelism on our own families, one line per model and key,
before a model loads: a head count or width that ``tensor_parallel_degree`` does not divide
(`ppo.models.families.tensor_parallel.problems`, which the model's constructor applies too)."""
import os


def model_problems(args, model_dirs):
    """Problems of the models `(argument name, path)` that tensor parallelism would split."""
    degree = int(getattr(args, "tensor_parallel_degree", 1) or 1)
    if degree <= 1:
        return []
    from ppo.common.startup_checks import model_config

    problems = []
    for name, path in model_dirs:
        config = model_config(path) if path and os.path.isdir(path) else None
        if config is not None:
            problems += [f"{name} {path}: {p}" for p in _family_problems(config, degree)]
    return problems


def _family_problems(config, degree):
    from ppo.models.families import family_module
    from ppo.models.families.tensor_parallel import problems

    module = family_module(config.get("model_type"))
    if module is None:  # PaddleNLP's classes (Llama, Qwen2) replicate what the degree does not divide
        return []
    try:
        parsed = module.CONFIG_CLASS.from_dict(dict(config, tensor_parallel_degree=degree))
    except (ValueError, TypeError, KeyError):  # a config the family refuses: its own check names it
        return []
    return problems(parsed, module.PRETRAINED_CLASS.moe_layout)
