"""The `Trainer` side of the parallel layouts (`ppo.strategy.trainer_strategy`): SFT, the reward
model and the offline DPO family get their layout from the layout `choose_layout` names; the
layouts compose (the expert axis wraps another layout's object, no layout inherits another's),
`LayoutTrainerMixin` runs the layout's hooks inside PaddleNLP's `Trainer` methods, and a layout
registered from outside the package (`register_layout`) is chosen and trains an SFT run."""
import contextlib
import os
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

import ppo.strategy as strategy
from ppo.strategy import LayoutTrainerMixin, Strategy, TrainerLayout, choose_layout, register_axis, register_layout, trainer_strategy
from ppo.strategy.expert.trainer import ExpertTrainerAxis
from ppo.strategy.pipeline.trainer import PipelineTrainerLayout


def layout_args(pp=1, hybrid=False, **extra):
    return SimpleNamespace(pipeline_parallel_degree=pp, tensor_parallel_degree=1, use_hybrid_parallel=hybrid, **extra)


@pytest.mark.parametrize("args, world, cls", [
    (layout_args(), 1, TrainerLayout),
    (layout_args(hybrid=True), 4, TrainerLayout),  # PaddleNLP's Trainer runs fleet's tensor, sharding and data axes itself
    (layout_args(pp=2, hybrid=True), 2, PipelineTrainerLayout),
])
def test_the_trainer_layout_follows_choose_layout(args, world, cls):
    assert type(strategy.TRAINER_LAYOUTS[choose_layout(args, world)](args)) is cls
    if world == 1 or cls is PipelineTrainerLayout:  # this process is one rank: trainer_strategy sees world 1
        chosen = trainer_strategy(args)
        assert type(chosen) is cls and chosen.args is args


def test_trainer_layouts_compose_and_none_inherits_another():
    CALLS.clear()
    assert set(strategy.TRAINER_LAYOUTS) == set(strategy.LAYOUTS)  # every layout has its Trainer side
    assert PipelineTrainerLayout.__bases__ == (TrainerLayout,) and ExpertTrainerAxis.__bases__ == (object,)
    inner = Recording(layout_args())
    axis = ExpertTrainerAxis(inner, layout=SimpleNamespace(rank=0))
    assert axis.name == "expert+recording" and axis.args is inner.args
    assert axis.pair_end_scores(None, {}) is None and axis.last_stage_means("means") == "means"  # inner's
    trainer = SimpleNamespace(args=SimpleNamespace(ignore_save_lr_and_optim=True), calls=[])
    model = paddle.nn.Linear(2, 2)  # no sparse blocks: gathering the experts changes nothing
    with axis.whole_model(model):
        trainer.calls.append("inside")
    with axis.generation_weights(model, contextlib.nullcontext("generation model")) as generated:
        assert generated == "generation model"
    axis.checkpoint_saved(trainer)
    axis.checkpoint_loaded(trainer, None)
    axis.optimizer_loaded(trainer, None)
    assert inner.calls == ["whole_model in", "whole_model out", "generation_weights", "checkpoint_saved", "checkpoint_loaded",
                           "optimizer_loaded"]


class FakeTrainer:
    """The PaddleNLP `Trainer` methods `LayoutTrainerMixin` wraps, recording their calls."""

    def __init__(self, layout):
        self.trainer_layout, self.model, self.calls, self.optimizer = layout, "model", layout.calls, None

    def create_optimizer(self, lr_scheduler=None):
        return "optimizer"

    def _wrap_model(self, model, training=True):
        self.calls.append("Trainer._wrap_model")
        return "wrapped " + model

    def save_model(self, output_dir=None, merge_tensor_parallel=False):
        self.calls.append("Trainer.save_model")
        return output_dir

    def _save_checkpoint(self, model, metrics=None):
        self.calls.append("Trainer._save_checkpoint")

    def _load_from_checkpoint(self, resume_from_checkpoint=None):
        self.calls.append("Trainer._load_from_checkpoint")

    def _load_optimizer_and_scheduler(self, checkpoint):
        self.calls.append("Trainer._load_optimizer_and_scheduler")

    def generation_weights(self):
        return contextlib.nullcontext(self.model)


class HookedTrainer(LayoutTrainerMixin, FakeTrainer):
    pass


def test_the_trainer_mixin_runs_the_layout_hooks_around_the_trainer_methods():
    CALLS.clear()
    trainer = HookedTrainer(Recording(layout_args()))
    assert trainer.create_optimizer() == "optimizer (recording)"
    assert trainer._wrap_model("model") == "wrapped model"
    assert trainer.save_model("out") == "out"
    trainer._save_checkpoint("model")
    trainer._load_from_checkpoint("checkpoint-2")
    trainer._load_optimizer_and_scheduler("checkpoint-2")
    with trainer.generation_weights() as model:
        assert model == "model"
    assert trainer.calls == [
        "optimizer_created", "wrapping in", "Trainer._wrap_model", "wrapping out", "whole_model in", "Trainer.save_model",
        "whole_model out", "Trainer._save_checkpoint", "checkpoint_saved", "Trainer._load_from_checkpoint",
        "checkpoint_loaded", "Trainer._load_optimizer_and_scheduler", "optimizer_loaded", "generation_weights"]


CALLS = []
"""What the test-only layout below was asked, in order (one run at a time)."""


class Recording(TrainerLayout):
    """A test-only `Trainer` layout: the whole-model one, recording every call."""

    name = "recording"

    def __init__(self, args):
        super().__init__(args)
        self.calls = CALLS

    def _record(self, name):
        self.calls.append(name)

    def log_settings(self):
        self._record("log_settings")

    def load_causal_lm(self, path, **overrides):
        self._record("load_causal_lm")
        return super().load_causal_lm(path, **overrides)

    def place(self, model):
        self._record("place")
        return model

    def optimizer_created(self, trainer, optimizer):
        self._record("optimizer_created")
        return optimizer + " (recording)" if isinstance(optimizer, str) else optimizer

    @contextlib.contextmanager
    def wrapping(self, trainer):
        self._record("wrapping in")
        yield
        self._record("wrapping out")

    @contextlib.contextmanager
    def whole_model(self, model):
        self._record("whole_model in")
        yield
        self._record("whole_model out")

    def generation_weights(self, model, inner):
        self._record("generation_weights")
        return inner

    def checkpoint_saved(self, trainer):
        self._record("checkpoint_saved")

    def checkpoint_loaded(self, trainer, checkpoint):
        self._record("checkpoint_loaded")

    def optimizer_loaded(self, trainer, checkpoint):
        self._record("optimizer_loaded")


class RecordingStrategy(Strategy):
    """The test-only layout's `Strategy` (the plain defaults), recording the final save."""

    name = "recording"

    def save_trainer_model(self, trainer, path, merge_tensor_parallel=None):
        CALLS.append("save_trainer_model")
        super().save_trainer_model(trainer, path, merge_tensor_parallel)


def test_a_layout_registered_from_outside_is_chosen_and_trains_sft(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """docs/architecture.md's recipe for a new layout: its classes and `register_layout`, nothing
    in the package edited; SFT's entry point builds it through `trainer_strategy`, the `Trainer`
    runs its hooks and the final save goes through its `Strategy`."""
    from sft.run_sft import main as run_sft
    from tests.test_trainer_faults import sft_argv

    monkeypatch.setattr(strategy, "LAYOUTS", dict(strategy.LAYOUTS))
    monkeypatch.setattr(strategy, "TRAINER_LAYOUTS", dict(strategy.TRAINER_LAYOUTS))
    monkeypatch.setattr(strategy, "LAYOUT_RULES", list(strategy.LAYOUT_RULES))
    register_layout("recording", RecordingStrategy, Recording, lambda args, world: "recording" in str(args.output_dir))
    with pytest.raises(ValueError, match="'recording' is registered already"):
        register_layout("recording", RecordingStrategy, Recording, lambda args, world: True)
    assert choose_layout(SimpleNamespace(output_dir="x/recording", pipeline_parallel_degree=2), 4) == "recording"
    assert choose_layout(layout_args(pp=2, output_dir="x/other"), 4) == "pipeline"

    CALLS.clear()
    out = str(tmp_path / "recording")
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "2", "--save_steps", "2"))
    assert CALLS == [
        "log_settings", "load_causal_lm", "place",  # the entry point loads and places the model
        "optimizer_created", "checkpoint_loaded", "wrapping in", "wrapping out", "optimizer_loaded",  # Trainer.train starts
        "whole_model in", "whole_model out", "checkpoint_saved",  # checkpoint-2
        "save_trainer_model", "whole_model in", "whole_model out",  # the final model, through the layout's Strategy
    ]
    start = paddle.load(os.path.join(tiny_model_dir, "model_state.pdparams"))
    saved = paddle.load(os.path.join(out, "model_state.pdparams"))
    assert sorted(saved) == sorted(start)
    assert any(not np.allclose(saved[k].numpy(), start[k].numpy()) for k in saved)  # it trained, and saved the model


AXIS_CALLS = []
"""What the test-only axes below were asked, in order (one run at a time)."""


class RecordingAxisStrategy:
    """A test-only axis over another layout's `Strategy`: records the final save, answers the rest
    by `inner` (as `ExpertStrategy` does)."""

    def __init__(self, inner, tag):
        self.inner, self.tag, self.ranks, self.name = inner, tag, inner.ranks, f"{tag}+{inner.name}"

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def save_trainer_model(self, trainer, path, merge_tensor_parallel=None):
        AXIS_CALLS.append(f"{self.tag} save_trainer_model")
        self.inner.save_trainer_model(trainer, path, merge_tensor_parallel)


class RecordingTrainerAxis:
    """A test-only axis over another layout's `TrainerLayout` (as `ExpertTrainerAxis`): records the
    hooks it passes on to `inner`."""

    def __init__(self, inner, tag):
        self.inner, self.tag, self.args, self.name = inner, tag, inner.args, f"{tag}+{inner.name}"

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def place(self, model):
        AXIS_CALLS.append(f"{self.tag} place")
        return self.inner.place(model)

    def optimizer_created(self, trainer, optimizer):
        AXIS_CALLS.append(f"{self.tag} optimizer_created")
        return self.inner.optimizer_created(trainer, optimizer)

    def prediction_step(self, own_step, trainer_step):
        AXIS_CALLS.append(f"{self.tag} prediction_step")
        return self.inner.prediction_step(own_step, trainer_step)

    def checkpoint_saved(self, trainer):
        AXIS_CALLS.append(f"{self.tag} checkpoint_saved")
        self.inner.checkpoint_saved(trainer)


def recording_axis(tag):
    """`register_axis`'s arguments of a test-only axis that applies to runs whose `output_dir` is
    named "axes"."""

    def wrap(strategy, args):
        AXIS_CALLS.append(f"{tag} wrap")
        return RecordingAxisStrategy(strategy, tag)

    def wrap_trainer(layout, args):
        AXIS_CALLS.append(f"{tag} wrap_trainer")
        return RecordingTrainerAxis(layout, tag)

    return tag, wrap, wrap_trainer, lambda args: os.path.basename(str(args.output_dir)) == "axes"


def test_axes_registered_from_outside_wrap_the_layout_in_order_and_change_no_number(tiny_model_dir, tiny_data_dir, tmp_path,
                                                                                     monkeypatch):
    """docs/architecture.md's recipe for a new axis: its objects and `register_axis`, nothing in the
    package edited. Two axes wrap SFT's layout in registration order (the first innermost: the
    second passes each hook on to it), SFT's evaluation step and final save go through them, and
    an axis that changes nothing trains the run of the plain layout bit for bit."""
    from ppo.strategy import axes
    from sft.run_sft import main as run_sft
    from tests.test_trainer_faults import loss_rows, sft_argv

    assert [axis.name for axis in axes.AXES] == ["expert"]  # the package's axes register themselves
    monkeypatch.setattr(axes, "AXES", list(axes.AXES))
    register_axis(*recording_axis("first"))
    register_axis(*recording_axis("second"))
    with pytest.raises(ValueError, match="axis 'first' is registered already"):
        register_axis(*recording_axis("first"))
    assert type(trainer_strategy(layout_args(output_dir="x/plain"))) is TrainerLayout  # an axis applies where it asks
    AXIS_CALLS.clear()

    runs = {}
    for name in ("plain", "axes"):
        out = str(tmp_path / name)
        run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "2", "--save_steps", "2", "--do_eval", "true",
                         "--eval_steps", "2"))
        runs[name] = out
    assert AXIS_CALLS == [
        "first wrap_trainer", "second wrap_trainer",  # trainer_strategy: registration order
        "second place", "first place",
        "second optimizer_created", "first optimizer_created",
        "second prediction_step", "first prediction_step",  # evaluation at step 2 (one eval batch)
        "second checkpoint_saved", "first checkpoint_saved",  # checkpoint-2
        "first wrap", "second wrap", "second save_trainer_model", "first save_trainer_model",  # build_strategy: the final save
        "second prediction_step", "first prediction_step",  # the final evaluation
    ]
    assert loss_rows(runs["axes"]) == loss_rows(runs["plain"]) and len(loss_rows(runs["plain"])) == 2
    plain = paddle.load(os.path.join(runs["plain"], "model_state.pdparams"))
    wrapped = paddle.load(os.path.join(runs["axes"], "model_state.pdparams"))
    assert sorted(wrapped) == sorted(plain)
    assert all(np.array_equal(wrapped[k].numpy(), plain[k].numpy()) for k in plain)
