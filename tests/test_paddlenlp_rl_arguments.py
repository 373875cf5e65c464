"""The keys of PaddleNLP's RL entry (ppo/entry/paddlenlp_rl_arguments.py): each acts with PaddleNLP's
meaning, or a value that needs a missing feature is refused naming it."""
from types import SimpleNamespace

import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.entry.paddlenlp_rl_arguments import (
    offload_level_with_optim,
    paddlenlp_rl_problems,
    placement_problems,
    rollout_eval_mode,
)
from tests.test_paddlenlp_dropin import entry_classes


def parse_ppo(tmp_path, *flags):
    return parse_arguments(entry_classes("ppo"), ["--output_dir", str(tmp_path), *flags])


def refusal(tmp_path, *flags):
    with pytest.raises(ArgumentError) as info:
        parse_ppo(tmp_path, *flags)
    return str(info.value)


def placement(**kw):
    base = dict(rollout_tensor_parallel_degree=-1, tensor_parallel_degree=2, eval_mode="", use_fp32_compute=True,
                bf16=False, fp16=False, pipeline_parallel_degree=1)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("degree, eval_mode, problem, mode", [
    (-1, "", None, ""),  # PaddleNLP's default: eval_mode decides
    (1, "", None, ""), (1, "single", None, "single"),  # gathered weights on each rank
    (2, "", None, "tensor_parallel"), (2, "tensor_parallel", None, "tensor_parallel"),  # each rank's own slices
    (1, "tensor_parallel", "choose one", "tensor_parallel"), (2, "single", "choose one", "single"),
    (4, "", "a rollout resharded to another tensor-parallel degree", "tensor_parallel"), (0, "", "positive or -1", ""),
])
def test_rollout_tensor_parallel_degree(degree, eval_mode, problem, mode):
    args = placement(rollout_tensor_parallel_degree=degree, eval_mode=eval_mode)
    problems = placement_problems(args)
    assert (not problems) if problem is None else any(problem in p for p in problems), problems
    assert rollout_eval_mode(args) == mode


@pytest.mark.parametrize("tp", [1, 2])
def test_with_split_rollout_the_degree_is_the_replicas_own(tp):
    """rollout_placement split: any degree is the rollout replicas' (resharded from the trainer's
    tensor_parallel_degree, checked against rollout_ranks elsewhere); the trainer's eval_mode is left as given."""
    args = placement(rollout_tensor_parallel_degree=4, tensor_parallel_degree=tp, rollout_placement="split")
    assert placement_problems(args) == [] and rollout_eval_mode(args) == ""


def test_use_fp32_compute_false_is_the_training_dtype(tmp_path):
    """false: the log-prob passes run in the training dtype (float32 training: float32); bf16/fp16
    is accepted with it except on pipeline stages, whose log-probs are float32 only."""
    _, _, args = parse_ppo(tmp_path, "--use_fp32_compute", "false")
    assert args.use_fp32_compute is False and args.logprob_dtype == "float32"
    assert not placement_problems(placement(use_fp32_compute=False, bf16=True))
    assert any("pipeline stages compute their log-probs from float32 logits only" in p
               for p in placement_problems(placement(use_fp32_compute=False, bf16=True, pipeline_parallel_degree=2)))
    dtype = type(args).logprob_dtype.fget
    assert dtype(SimpleNamespace(use_fp32_compute=False, bf16=True, fp16=False)) == "bfloat16"
    assert dtype(SimpleNamespace(use_fp32_compute=False, bf16=False, fp16=True)) == "float16"
    assert dtype(SimpleNamespace(use_fp32_compute=True, bf16=True, fp16=False)) == "float32"


def test_offload_optim_offloads_the_optimizer_states(tmp_path):
    _, _, args = parse_ppo(tmp_path, "--offload_optim", "true", "--offload_level", "freeze_model")
    assert args.offload_level == "freeze_model optimizer"
    assert offload_level_with_optim(SimpleNamespace(offload_level="optimizer", offload_optim=True)) == "optimizer"
    _, _, args = parse_ppo(tmp_path, "--offload_level", "freeze_model")
    assert args.offload_level == "freeze_model"


def test_vapo_selects_the_estimator_and_names_its_refused_combinations(tmp_path):
    _, _, args = parse_ppo(tmp_path, "--rl_algorithm", "vapo")
    assert args.adv_estimator == "vapo" and args.use_critic and args.normalize_advantage
    message = refusal(tmp_path, "--rl_algorithm", "vapo", "--gae_lambda", "0.9", "--pretrain_critic_steps", "-1",
                      "--positive_example_lm_coeff", "-0.1")
    assert "gae_lambda 0.9 with adv_estimator vapo" in message
    assert "pretrain_critic_steps must be >= 0, got -1" in message
    assert "positive_example_lm_coeff must be >= 0, got -0.1" in message
    assert "only adv_estimator vapo" in refusal(tmp_path, "--rl_algorithm", "ppo", "--critic_gae_lambda", "0.9")


def test_vapo_settings_reach_the_estimator(tmp_path):
    """vapo_alpha and critic_gae_lambda are the vapo entry's settings: the loop passes the
    arguments of those names (ppo.entry.ppo_argument_checks.estimator_settings)."""
    from ppo.entry.ppo_argument_checks import estimator_settings

    _, _, args = parse_ppo(tmp_path, "--rl_algorithm", "vapo", "--vapo_alpha", "0.1", "--critic_gae_lambda", "0.9")
    assert estimator_settings(args) == {"vapo_alpha": 0.1, "critic_gae_lambda": 0.9}
    _, _, args = parse_ppo(tmp_path, "--rl_algorithm", "vapo")
    assert estimator_settings(args) == {"vapo_alpha": 0.05, "critic_gae_lambda": 1.0}


def test_vapo_value_pretraining_and_positive_examples_are_accepted(tmp_path):
    _, _, args = parse_ppo(tmp_path, "--rl_algorithm", "vapo", "--pretrain_critic_steps", "5",
                           "--positive_example_lm_coeff", "0.1", "--positive_example_min_score", "0.5")
    assert (args.pretrain_critic_steps, args.positive_example_lm_coeff, args.positive_example_min_score) == (5, 0.1, 0.5)
    _, _, args = parse_ppo(tmp_path, "--rl_algorithm", "ppo", "--pretrain_critic_steps", "2")
    assert args.pretrain_critic_steps == 2 and args.use_critic


def test_value_pretraining_needs_a_critic_and_min_score_needs_the_loss(tmp_path):
    message = refusal(tmp_path, "--rl_algorithm", "grpo", "--rollout_n", "4", "--pretrain_critic_steps", "3",
                      "--positive_example_min_score", "0.5")
    assert "pretrain_critic_steps 3 pretrains the critic, but adv_estimator grpo has none" in message
    assert "positive_example_min_score 0.5 set, but only positive_example_lm_coeff > 0 reads it" in message


def test_early_stopping_needs_the_evaluation(tmp_path):
    message = refusal(tmp_path, "--early_stopping", "true", "--early_stopping_patience", "0")
    assert "early_stopping_patience must be >= 1" in message
    assert "needs load_best_model_at_end true, metric_for_best_model, evaluation_strategy steps" in message
    _, _, args = parse_ppo(tmp_path, "--early_stopping", "true", "--load_best_model_at_end", "true",
                           "--metric_for_best_model", "accuracy", "--evaluation_strategy", "steps", "--eval_steps", "2")
    assert args.early_stopping and args.early_stopping_patience == 4


def test_prm_rollout_settings_are_checked():
    args = SimpleNamespace(prm_reduction="mean", prm_step_separator="", prm_step_tokens=0, pretrain_critic_steps=0, vapo_alpha=0.05,
                           critic_gae_lambda=1.0, adv_estimator="gae", gae_lambda=0.95, positive_example_lm_coeff=0.0,
                           positive_example_min_score=1.0,
                           early_stopping=False, early_stopping_patience=4, early_stopping_threshold=0.0,
                           **vars(placement(tensor_parallel_degree=1)))
    problems = paddlenlp_rl_problems(args)
    assert any("prm_reduction must be one of ('last', 'min', 'step')" in p for p in problems)
    assert any("prm_step_separator must not be empty" in p for p in problems)
