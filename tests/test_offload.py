"""offload_level: which models and optimizer states move when, in a real PPO step (the moves
recorded by a stand-in mover, since this machine has no CUDA device), the CPU no-op notice,
argument checks, and eval_mode / pipeline refusals."""
import logging
from types import SimpleNamespace

import pytest

from ppo.optimization.offload import OffloadPlan, parse_offload_level


class RecordingMover:
    """Records `(direction, kind, id(obj))` instead of moving tensors."""

    def __init__(self):
        self.moves = []

    def __getattr__(self, name):
        kind, _, direction = name.partition("_to_")
        if direction not in ("host", "device"):
            raise AttributeError(name)
        return lambda obj: self.moves.append((direction, kind, id(obj)))


def test_parse_offload_level():
    assert parse_offload_level("") == frozenset()
    assert parse_offload_level("freeze_model optimizer") == {"freeze_model", "optimizer"}
    assert parse_offload_level("train_model,optimizer") == {"train_model", "optimizer"}
    with pytest.raises(ValueError, match=r"unknown \['gpu'\]"):
        parse_offload_level("freeze_model gpu")


def test_scope_moves_only_offloaded_categories_and_restores():
    actor, ref, critic, opt = object(), object(), object(), object()
    mover = RecordingMover()
    plan = OffloadPlan({"freeze_model", "optimizer"}, {"actor": actor, "reference": ref, "critic": critic},
                       {"actor_optimizer": opt}, mover=mover, enabled=True)
    plan.offload_all()
    assert sorted(mover.moves) == sorted([("host", "model", id(ref)), ("host", "optimizer", id(opt))])
    mover.moves.clear()
    with plan.scope("actor", "reference"):  # actor is train_model: not offloaded, never moved
        assert mover.moves == [("device", "model", id(ref))]
    assert mover.moves[-1] == ("host", "model", id(ref))
    mover.moves.clear()
    with plan.scope("actor", with_optimizer=True):
        assert mover.moves == [("device", "optimizer", id(opt))]
    assert mover.moves == [("device", "optimizer", id(opt)), ("host", "optimizer", id(opt))]


def test_disabled_plan_moves_nothing_and_says_so_once(caplog):
    mover = RecordingMover()
    with caplog.at_level(logging.WARNING, logger="ppo.offload"):
        plan = OffloadPlan({"train_model"}, {"actor": object()}, {}, mover=mover, enabled=False)
        plan.offload_all()
        with plan.scope("actor", with_optimizer=True):
            pass
    assert mover.moves == []
    notices = [r for r in caplog.records if "offload_level train_model does nothing here" in r.getMessage()]
    assert len(notices) == 1


def test_a_ppo_step_moves_each_model_around_the_phase_that_uses_it(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """PPO (actor, reference, reward model, critic) with every category offloaded: each model
    is on the device only inside its phases, and everything is back on the host after the step."""
    from ppo.run_ppo import build_trainer
    from tests.test_ppo_trainer import ppo_argv

    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, str(tmp_path / "out"), "--max_steps", "1",
                                     "--offload_level", "freeze_model optimizer train_model"))
    models = trainer.passes.models
    names = {id(models.actor): "actor", id(models.reference): "reference", id(models.reward): "reward",
             id(models.critic): "critic", **{id(t.optimizer): f"{t.name}_optimizer" for t in trainer.learner.trained}}
    mover = RecordingMover()
    plan = trainer.offload
    plan.mover, plan.enabled = mover, True  # as on a CUDA build
    plan.offload_all()
    assert plan.on_host == set(names.values())
    mover.moves.clear()
    trainer.train_step()
    to_device = [names[i] for d, _, i in mover.moves if d == "device"]
    # rollout, reward scoring, old log-probs, reference log-probs, critic values, then the update
    assert to_device == ["actor", "reward", "reference", "critic", "actor", "actor_optimizer", "critic", "critic_optimizer"]
    assert plan.on_host == set(names.values())  # all back in host memory after the step
    # never two frozen models and the update's state on the device at once: each phase restores first
    depth, peak = 0, 0
    for direction, _, _ in mover.moves:
        depth += 1 if direction == "device" else -1
        peak = max(peak, depth)
    assert depth == 0 and peak == 4  # the update: actor, critic and their optimizers


def test_eval_mode_and_pipeline_refusals(tmp_path):
    from ppo.models.loading import load_overrides
    from ppo.entry.ppo_arguments import PPOTrainingArguments

    assert PPOTrainingArguments(output_dir=str(tmp_path), eval_mode="single").eval_mode == "single"
    assert PPOTrainingArguments(output_dir=str(tmp_path), eval_mode="tensor_parallel").eval_mode == "tensor_parallel"
    with pytest.raises(ValueError, match="eval_mode must be one of"):
        PPOTrainingArguments(output_dir=str(tmp_path), eval_mode="pipeline")
    with pytest.raises(ValueError, match="offload_level: unknown"):
        PPOTrainingArguments(output_dir=str(tmp_path), offload_level="everything")
    model_args = SimpleNamespace(use_flash_attention=False, recompute_granularity="full", recompute_use_reentrant=False,
                                 use_fused_rms_norm=False, use_fused_rope=False, use_fused_head_and_loss_fn=False, use_train_patch=True,
                                 fused_linear=False, use_fused_linear=False, flash_mask=False)
    training_args = SimpleNamespace(recompute=False, sequence_parallel=False, pipeline_parallel_degree=2,
                                    tensor_parallel_degree=1)
    with pytest.raises(ValueError, match="pipeline_parallel_degree 2: this loads plain models"):
        load_overrides(model_args, training_args)
    with pytest.raises(ValueError, match="pipeline_entry 'audit' is none of"):
        load_overrides(model_args, training_args, pipeline_entry="audit")
    for entry in ("sft", "rm", "dpo", "ppo"):
        assert "tensor_parallel_degree" not in load_overrides(model_args, training_args, pipeline_entry=entry)
