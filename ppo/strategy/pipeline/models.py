"""The PPO models of a pipeline run (`pipeline_parallel_degree > 1`): this rank's stages of
each, as `PipelineStrategy.load_models` loads them."""
from ...models.adapters import MERGE_TOOL
from ...models.loading import freeze, is_lora_dir, set_dropout_off
from ...models.ppo_models import PPOModels
from .pipe import load_pipe
from .score_pipe import load_plain_score_pipe


def build_ppo_pipes(model_args, use_critic, dtype="float32", **extra):
    """The models as pipelines (`pipeline_parallel_degree > 1`, see `ppo.strategy.pipeline.policy_pipe`):
    PaddleNLP's causal-LM pipe for the actor and the frozen reference, the score-model pipe for
    the frozen reward model and the critic (and PPO-Lagrangian's cost model and cost critic).
    The pipeline passes set the trained pipes' losses."""
    actor_path = model_args.actor_model_name_or_path
    for name in ("reward_model_name_or_path", "reward_critic_model_name_or_path", "cost_model_name_or_path",
                 "cost_critic_model_name_or_path"):
        if is_lora_dir(getattr(model_args, name)):
            raise ValueError(
                f"{name}={getattr(model_args, name)}: a LoRA adapter with pipeline_parallel_degree > 1 is not implemented "
                f"here; merge it into a full model first ({MERGE_TOOL})"
            )
    actor = set_dropout_off(load_pipe(actor_path, None, None, dtype=dtype, **extra))
    reference = freeze(set_dropout_off(load_pipe(model_args.reference_model_name_or_path or actor_path, None, None, dtype=dtype, **extra)))
    reward = None
    if not (model_args.use_rm_server or model_args.use_rule_reward):
        reward = freeze(set_dropout_off(load_plain_score_pipe(model_args.reward_model_name_or_path, dtype=dtype, **extra)))
    critic_of = lambda path: set_dropout_off(load_plain_score_pipe(  # noqa: E731
        path, dtype=dtype, score_type="critic", do_normalize=False, normalizer_type=None, **extra))
    critic = critic_of(model_args.reward_critic_model_name_or_path or model_args.reward_model_name_or_path) if use_critic else None
    cost = cost_critic = None
    if model_args.cost_model_name_or_path:  # PPO-Lagrangian
        cost = freeze(set_dropout_off(load_plain_score_pipe(model_args.cost_model_name_or_path, dtype=dtype, **extra)))
        cost_critic = critic_of(model_args.cost_critic_model_name_or_path or model_args.cost_model_name_or_path)
    return PPOModels(actor=actor, reference=reference, reward=reward, critic=critic, cost=cost, cost_critic=cost_critic)
