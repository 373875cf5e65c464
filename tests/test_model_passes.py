"""The seam between the PPO step and the parallel strategy (`ppo.passes`): the trainer reaches
the models only through its `ModelPasses` and never names a strategy; the pipeline passes never
call the trainer and keep fleet's private attributes in two small functions."""
import ast
import contextlib
import os

import numpy as np

from ppo.passes import ModelPasses, PlainPasses
from ppo.run_ppo import build_trainer
from ppo.strategy import PlainStrategy
from ppo.trainer.updater import minibatch_plan
from tests.test_ppo_trainer import ppo_argv, read_metrics, weights

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER_FILES = ["ppo/entry/ppo_trainer.py"] + sorted(f"ppo/trainer/{name}" for name in os.listdir(os.path.join(REPO, "ppo", "trainer"))
                                                if name.endswith(".py"))
FLEET_PRIVATE = {"_loss_fn", "_prepare_training", "optimizer", "lr_scheduler", "accumulate_steps", "forward_hooks",
                 "backward_hooks", "forward_backward_pipeline"}


def parsed(rel):
    with open(os.path.join(REPO, rel)) as f:
        return ast.parse(f.read())


def test_trainer_code_never_names_the_parallel_strategy():
    for rel in TRAINER_FILES:
        tree = parsed(rel)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {"pipeline_parallel_degree", "pipes", "generation_copy"} & attrs, rel
        assert not {"PipelinePasses", "PlainPasses", "isinstance"} & names, rel
        assert not any(m.endswith("passes.pipeline") or m.endswith("pipeline.passes") or m.endswith("passes.plain") for m in modules), rel


def test_passes_never_call_the_trainer_and_fleet_internals_stay_in_two_functions():
    for rel in ("ppo/passes/base.py", "ppo/passes/plain.py", "ppo/strategy/pipeline/passes.py", "ppo/passes/__init__.py"):
        tree = parsed(rel)
        assert not any(isinstance(n, ast.Name) and "trainer" in n.id.lower() for n in ast.walk(tree)), rel
        assert not any(isinstance(n, ast.Attribute) and n.attr == "trainer" for n in ast.walk(tree)), rel
    allowed = {"install_last_stage_loss", "set_micro_batches", "fleet_forward_backward"}
    for func in ast.walk(parsed("ppo/strategy/pipeline/passes.py")):
        if isinstance(func, ast.FunctionDef) and func.name not in allowed:
            touched = {n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute)} & FLEET_PRIVATE
            assert not touched, f"{func.name} touches fleet's {touched}"


def test_minibatch_plan_covers_every_row_once():
    plan = minibatch_plan(10, micro_rows=3, accumulation=2, seed=5)
    assert [[len(mb) for mb in step] for step in plan] == [[3, 3], [3, 1]]
    assert sorted(r for step in plan for mb in step for r in mb) == list(range(10))
    assert plan == minibatch_plan(10, 3, 2, 5) and plan != minibatch_plan(10, 3, 2, 6)


class RecordingPasses(ModelPasses):
    """Another strategy's passes as the trainer sees them: the real plain passes underneath,
    every call recorded, and (like the pipeline passes) no reusable first forward."""

    def __init__(self, inner):
        self.inner, self.calls, self.depth = inner, [], 0
        self.generation_model, self.models = inner.generation_model, inner.models

    @contextlib.contextmanager
    def inside(self, name):
        self.calls.append(name)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    @contextlib.contextmanager
    def generation_weights(self):
        with self.inside("generation_weights"), self.inner.generation_weights() as model:
            yield model

    def logprobs(self, which, exp):
        with self.inside(f"logprobs:{which}"):
            return self.inner.logprobs(which, exp)

    def values(self, objective, exp):
        with self.inside(f"values:{objective}"):
            return self.inner.values(objective, exp)

    def scores(self, objective, exp):
        with self.inside(f"scores:{objective}"):
            return self.inner.scores(objective, exp)

    def first_forward_reusable(self):
        return False

    def first_forward(self, exp):
        raise AssertionError("the trainer asked for a first forward the passes said they cannot keep")

    def backward_step(self, exp, plan, losses, first_forward=None):
        assert first_forward is None, "a first forward the passes said they cannot keep"
        with self.inside("backward_step"):
            return self.inner.backward_step(exp, plan, losses)

    def group_sum(self, value):
        self.calls.append("group_sum")
        return value


class RecordingStrategy(PlainStrategy):
    """A new parallel strategy as the trainer meets it: a strategy class and its passes
    (`RecordingPasses`), nothing else changed."""

    name = "recording"

    def build_passes(self, models, actor, critics, optimizers, settings):
        self.passes = RecordingPasses(super().build_passes(models, actor, critics, optimizers, settings))
        return self.passes


def test_the_trainer_reaches_every_model_through_its_passes(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """Another strategy whose passes cannot keep the first forward (the pipeline's answer) runs
    the same trainer code: every model forward of a PPO step happens inside a passes call, in
    step order."""
    out = str(tmp_path / "ppo")
    argv = ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "1", "--kl_coeff", "0.1",
                    "--per_device_train_batch_size", "8", "--reuse_first_update_forward", "true", "--use_rollout_logprobs", "false")
    plain = build_trainer(argv)
    assert isinstance(plain.passes, PlainPasses) and plain.experience.completion.first_update_forward_reusable(8)
    strategy = RecordingStrategy()
    trainer = build_trainer(argv, strategy=strategy)
    recording = strategy.passes
    assert trainer.passes is recording and not trainer.experience.completion.first_update_forward_reusable(8)
    outside = []
    for name in ("actor", "reference", "reward", "critic"):
        model = getattr(trainer.passes.models, name)
        model.register_forward_pre_hook(lambda layer, inputs, name=name: outside.append(name) if recording.depth == 0 else None)
    before = weights(trainer.passes.models.actor)
    trainer.train()
    optimiser_steps = len(trainer.learner.minibatch_plan(8, 0)) * trainer.learner.settings.update_iters
    assert recording.calls == ["generation_weights", "scores:reward", "logprobs:reference", "logprobs:actor", "values:reward",
                               *["backward_step"] * optimiser_steps, "group_sum"]
    assert outside == []
    (line,) = [r for r in read_metrics(out) if "loss/policy_avg" in r]
    assert np.isfinite(line["loss/policy_avg"]) and np.isfinite(line["loss/value_avg"])
    assert any(not np.array_equal(p.numpy(), before[n]) for n, p in trainer.passes.models.actor.named_parameters())
