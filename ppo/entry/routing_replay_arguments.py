"""`moe_routing_replay`: the training forward of a mixture-of-experts actor uses the experts the
rollout routed each token to (R3, Ma et al. 2025, `ppo.models.routing_replay`).

`routing_replay_problems` refuses, before any model loads, each setting that cannot record or
replay the routing, one line naming its key.
"""
from dataclasses import dataclass, field
from typing import ClassVar

MOE_ROUTING_REPLAYS = ("none", "rollout")


@dataclass
class RoutingReplayArguments:
    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"moe_routing_replay": "ppo.entry.routing_replay_arguments:MOE_ROUTING_REPLAYS"}
    moe_routing_replay: str = field(
        default="none",
        metadata={"help": "Mixture-of-experts actor: rollout = the rollout engine records each token's experts and the "
                  "actor's training forwards of those tokens (old log-probs, the update) use them instead of the "
                  "router's own top-k (R3, routing replay; the router's weights at those experts keep their gradient; "
                  "the reference keeps its own routing; logs moe/replay_agreement); none = every forward routes itself."},
    )


def _actor_model_type(model_args):
    from ..models.families import dir_model_type

    path = getattr(model_args, "actor_model_name_or_path", None)
    return dir_model_type(path) if path else None


def routing_replay_problems(model_args, args):
    """One line per setting that cannot replay the rollout's routing (none without it)."""
    value = getattr(args, "moe_routing_replay", "none")
    if value not in MOE_ROUTING_REPLAYS:
        return [f"moe_routing_replay {value!r}: choose one of {list(MOE_ROUTING_REPLAYS)}"]
    if value == "none":
        return []
    from ..common.model_families import FAMILIES

    key, problems = "moe_routing_replay rollout", []
    model_type = _actor_model_type(model_args)
    family = FAMILIES.get(model_type)
    if family is not None and not family.moe:
        problems.append(f"{key}: actor_model_name_or_path is a dense {model_type} model (no routed experts to replay); "
                        "set moe_routing_replay none")
    if not args.use_fusemt:
        problems.append(f"{key} with use_fusemt false: PaddleNLP's generate (the fallback rollout) does not record the "
                        "experts each token was routed to; set use_fusemt true")
    if args.env_name:
        problems.append(f"{key} with env_name: the multi-turn (agent) rollout does not record routing; set "
                        "moe_routing_replay none")
    if args.split_rollout:
        problems.append(f"{key} with rollout_placement split: the rollout rank's batches do not carry the recorded "
                        "experts here; use rollout_placement colocated")
    if args.pipeline_parallel_degree > 1:
        problems.append(f"{key} with pipeline_parallel_degree {args.pipeline_parallel_degree}: the pipeline stages do "
                        "not take the recorded experts; set pipeline_parallel_degree 1")
    return problems
