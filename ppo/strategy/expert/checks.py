"""Argument refusals of expert parallelism, each one line naming the key, before a model loads.

`expert_parallel_degree` (PaddleNLP's key; ``use_expert_parallel`` true is accepted with it in
PPO/GRPO, and refused in the `Trainer` entry points, where PaddleNLP's Trainer would act on it):
composes with data parallelism (the expert groups are carved out of the data ranks) and tensor
parallelism (one set of groups per tensor-parallel slice, each expert split along its width),
and sharding stage 1 whose group is the expert group and every data rank
(``sharding_parallel_degree`` equal to ``expert_parallel_degree``, no data parallelism beside
it, no parameter fusion or split). Not yet: pipeline parallelism, other
sharding, LoRA, a split rollout rank."""
import os

NOT_YET = (
    ("pipeline_parallel_degree", lambda a: a.pipeline_parallel_degree > 1, "pipeline_parallel_degree > 1"),
    ("sharding", lambda a: _sharded(a) and not _stage1_over_experts(a),
     "sharding other than stage1 over every data rank at sharding_parallel_degree = expert_parallel_degree"),
    ("rollout_placement", lambda a: getattr(a, "split_rollout", False), "a split rollout rank"),
)


STAGE1_OPTIONS_REFUSED = ("split_param", "enable_stage1_tensor_fusion", "enable_stage1_overlap")


def _sharded(args):
    return bool(args.sharding) and max(args.sharding_parallel_degree, 1) > 1


def _stage1_over_experts(args):
    """Sharding stage 1 whose group is the expert group (`ppo.strategy.expert.sharding`), without
    the stage-1 options that fuse or split the parameters."""
    stages = {str(getattr(s, "value", s)) for s in args.sharding}
    config = str(getattr(args, "sharding_parallel_config", "") or "")
    tensor = max(int(getattr(args, "tensor_parallel_degree", 1) or 1), 1)
    every_data_rank = args.sharding_parallel_degree * tensor == world_size()  # no data parallelism beside it (untested)
    return stages == {"stage1"} and args.sharding_parallel_degree == expert_degree(args) and every_data_rank and not any(
        option in config for option in STAGE1_OPTIONS_REFUSED)


def expert_degree(args):
    """The run's expert-parallel degree (1: off)."""
    return max(int(args.expert_parallel_degree or 1), 1) if hasattr(args, "expert_parallel_degree") else 1


def world_size():
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def layout_problems(args, supported=True, use_lora=False, trainer=False):
    """Problems of the arguments' expert-parallel layout (`supported`: the entry point runs it;
    `trainer`: it runs PaddleNLP's `Trainer`, which acts on ``use_expert_parallel`` itself)."""
    degree = expert_degree(args)
    if args.use_expert_parallel and trainer:
        return ["use_expert_parallel: true makes PaddleNLP's Trainer write per-rank mixture-of-experts checkpoints; "
                "expert_parallel_degree alone runs expert parallelism here (one-process checkpoints): leave it false"]
    if args.use_expert_parallel and degree == 1:
        return ["use_expert_parallel: true needs expert_parallel_degree > 1 (the ranks the experts are split over)"]
    if degree == 1:
        return []
    if not supported:
        return [f"expert_parallel_degree {degree}: this entry point does not run expert parallelism "
                "(SFT, PPO and GRPO do); set it to 1"]
    world, tensor = world_size(), max(int(getattr(args, "tensor_parallel_degree", 1) or 1), 1)
    if tensor == 1 and world % degree:
        return [f"expert_parallel_degree {degree} does not divide the world size {world} (the launched processes)"]
    if tensor > 1 and not world % tensor and (world // tensor) % degree:  # (world % tensor: refused as tensor parallelism)
        return [f"expert_parallel_degree {degree} does not divide the data-parallel ranks {world // tensor} (world size "
                f"{world} / tensor_parallel_degree {tensor}): the experts are split over data ranks"]
    problems = [f"expert_parallel_degree {degree} with {what}: not supported yet (expert parallelism composes with "
                f"data, tensor and stage-1 sharding parallelism only)" for key, test, what in NOT_YET if test(args)]
    if use_lora:
        problems.append(f"expert_parallel_degree {degree} with use_lora: not supported yet (LoRA adapters on sharded experts)")
    return problems


def model_problems(args, model_dirs):
    """Problems of the models `(argument name, path)` that the expert-parallel layout would shard."""
    from ppo.common.startup_checks import model_config

    degree = expert_degree(args)
    if degree == 1:
        return []
    problems = []
    for name, path in model_dirs:
        config = model_config(path) if path and os.path.isdir(path) else None
        if config is None:
            continue
        key, experts = expert_count(config)
        if not experts:
            problems.append(f"expert_parallel_degree {degree}: {name} {path} is a dense model "
                            f"({config.get('model_type')}, no experts)")
        elif experts % degree:
            problems.append(f"expert_parallel_degree {degree} does not divide {key} {experts} of {name} {path}")
    return problems


def expert_count(config):
    """``(the family's key, routed experts)`` of a ``config.json`` dict: the count under the
    family's own key (ERNIE 4.5's ``moe_num_experts``, Mixtral's ``num_local_experts``, Qwen's
    ``num_experts``), else ``num_experts`` as our saved configs may write it; ``(None, 0)`` for a
    dense family."""
    from ppo.common.model_families import FAMILIES

    family = FAMILIES.get(config.get("model_type"))
    if family is None or not family.moe:
        return None, 0
    key = family.experts_key
    return key, int(config.get(key) or config.get("num_experts") or 0)
