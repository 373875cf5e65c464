"""rollout_placement split and async_staleness (ppo/trainer/remote_rollout.py, rollout_worker.py,
ppo/strategy/rollout_link.py): the placement refusals, the schedule both ranks follow, the
versioned weights, the importance weights of stale batches, and two-process runs against the
colocated one-process run (the launched runs: tests/test_async_launch.py)."""
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from ppo.algos.rollout_correction import rollout_is_weights
from ppo.common.argument_problems import ArgumentError
from ppo.entry.rollout_placement_arguments import rollout_placement_problems
from ppo.experience import Experience
from ppo.data.prompt_sampler import PromptSampler
from ppo.run_ppo import build_trainer
from ppo.strategy import rollout_link
from ppo.strategy.rollout_layout import RolloutLayout
from ppo.strategy.rollout_link import RolloutLink, weights_checksum
from ppo.trainer.advantages import AdvantageStage
from ppo.trainer.remote_rollout import RemoteRollout, experience_from_message, experience_message
from ppo.trainer.rollout_worker import RolloutWorker, RolloutWorkerState
from tests.rule_reward_helpers import rule_argv


def placement_args(**changes):
    base = dict(rollout_placement="split", rollout_ranks=1, async_staleness=0, tensor_parallel_degree=1,
                pipeline_parallel_degree=1, sharding_parallel_degree=1, use_fusemt=True, dynamic_sampling=False, env_name="",
                rollout_is="none", early_stopping=False)
    base.update(changes)
    args = SimpleNamespace(**base)
    args.split_rollout = args.rollout_placement == "split"
    return args


@pytest.mark.parametrize("changes, world, key", [
    ({}, 1, "rollout_placement split needs a launch of 2 processes"),
    ({"rollout_ranks": 2}, 2, "rollout_ranks 2 with 2 processes"),
    ({"rollout_ranks": 3}, 3, "rollout_ranks 3 with 3 processes: a split run needs at least one"),
    ({"rollout_ranks": 0}, 4, "rollout_ranks 0 with 4 processes: a split run needs at least one"),
    ({"tensor_parallel_degree": 2}, 2, "tensor_parallel_degree 2 with rollout_placement split"),
    ({"pipeline_parallel_degree": 2}, 2, "pipeline_parallel_degree 2 with rollout_placement split"),
    ({"async_staleness": 5, "rollout_is": "token"}, 2, "async_staleness must be in 0..4"),
    ({"async_staleness": -1}, 2, "async_staleness must be in 0..4"),
    ({"async_staleness": 1}, 2, "async_staleness 1 with rollout_is none"),
    ({"rollout_placement": "colocated", "async_staleness": 1}, 1, "async_staleness > 0 needs rollout_placement split"),
    ({"rollout_placement": "elsewhere"}, 2, "rollout_placement must be one of"),
    ({"use_fusemt": False}, 2, "use_fusemt false with rollout_placement split"),
    ({"dynamic_sampling": True}, 2, "dynamic_sampling with rollout_placement split"),
    ({"early_stopping": True}, 2, "early_stopping with rollout_placement split"),
])
def test_placement_problems_name_the_key(changes, world, key):
    problems = rollout_placement_problems(placement_args(**changes), world)
    assert any(key in p for p in problems), problems


def test_placements_that_work_have_no_problem():
    assert rollout_placement_problems(placement_args(rollout_placement="colocated"), 1) == []
    assert rollout_placement_problems(placement_args(), 2) == []
    assert rollout_placement_problems(placement_args(async_staleness=4, rollout_is="sequence"), 2) == []


def test_split_on_one_process_is_refused_before_models_load(tiny_model_dir, tiny_data_dir, tmp_path):
    argv = rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "o"), "--rollout_placement", "split", "--async_staleness", "9")
    with pytest.raises(ArgumentError) as err:
        build_trainer(argv)
    assert "rollout_placement split needs a launch of 2 processes" in str(err.value)
    assert "async_staleness must be in 0..4" in str(err.value)  # every problem at once
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


# ---------------------------------------------------------------- the schedule, with a recording link
class RecordingLink:
    """A `RolloutLink` stand-in: each side's operations in order, and the batches handed over."""

    trainer_rank, layout = 0, RolloutLayout(2, 1)

    def __init__(self, inbox=(), rank=0):
        self.ops, self.inbox, self.sent_objects, self.rank = [], list(inbox), [], rank

    def send_object(self, obj, dst, what=""):
        self.ops.append(("object", obj.get("index", "hello")))
        self.sent_objects.append(obj)

    def recv_object(self, src, what=""):
        message = self.inbox.pop(0)
        self.ops.append(("object", message.get("index", "hello")))
        return message

    def send_weights(self, params, version):
        self.ops.append(("weights", version))
        return 100.0 + version

    def receive_weights(self, params):
        version = self.inbox.pop(0)
        self.ops.append(("weights", version))
        return version, 100.0 + version


def tiny_experience(version, logprobs):
    """One row: 2 prompt tokens, 3 response tokens (the last one padding), `logprobs` the rollout's."""
    return Experience(prompt_len=2, sequences=paddle.to_tensor([[3, 4, 5, 6, 0]], dtype="int64"),
                      attention_mask=paddle.to_tensor([[1, 1, 1, 1, 0]], dtype="int64"),
                      position_ids=paddle.to_tensor([[0, 1, 2, 3, 3]], dtype="int64"),
                      response_ids=paddle.to_tensor([[5, 6, 0]], dtype="int64"),
                      response_mask=paddle.to_tensor([[1.0, 1.0, 0.0]]), group_ids=paddle.to_tensor([7], dtype="int64"),
                      src=["ab"], label=["ba"], prompt_text=["USER: ab ASSISTANT:"], version=version,
                      rollout_logprobs=paddle.to_tensor([logprobs], dtype="float32"),
                      ends_with_eos=paddle.to_tensor([True]))


class FakeRollout:
    """A `Rollout` stand-in for the worker: numbered experiences stamped with the state's version."""

    def __init__(self):
        self.state, self.sampler = RolloutWorkerState(), PromptSampler(64, 4, seed=1)

    def generate(self):
        self.sampler.next_indices()
        self.state.gen_batches += 1
        return tiny_experience(self.state.step, [-1.0, -2.0, 0.0])


def worker_ops(staleness, start, max_steps):
    """The rollout rank's operations when the trainer starts at `start`."""
    link = RecordingLink([{"start": start, "max_steps": max_steps, "gen_batches": start, "sampler": {"epoch": 0, "offset": 0}},
                          *range(start, max_steps)], rank=1)
    worker = RolloutWorker(link, {0: FakeRollout()}, [], staleness)
    worker.train()
    return link.ops, link.sent_objects


@pytest.mark.parametrize("staleness", [0, 1, 2, 4])
@pytest.mark.parametrize("start", [0, 3])
def test_both_ranks_follow_one_schedule(staleness, start):
    """The trainer's sends and receives pair up one for one with the rollout rank's (blocking
    collectives cannot deadlock), every batch arrives once, and batch b is sampled by version
    max(start, b - staleness)."""
    max_steps = 7
    w_ops, batches = worker_ops(staleness, start, max_steps)
    link = RecordingLink(batches)
    state = SimpleNamespace(step=start, gen_batches=start)
    remote = RemoteRollout(link, lambda: [], PromptSampler(64, 4, seed=1), state, staleness=staleness, max_steps=max_steps)
    versions = []
    for step in range(start, max_steps):
        exp = remote.generate()
        versions.append(exp.version)
        assert remote.metrics["async/staleness_mean"] == step - exp.version
        state.step += 1
    assert link.ops == w_ops
    assert versions == [max(start, b - staleness) for b in range(start, max_steps)]
    assert state.gen_batches == max_steps and not link.inbox


def test_a_finished_run_tells_the_rollout_rank_there_is_nothing_to_do():
    link = RecordingLink()
    RemoteRollout(link, lambda: [], PromptSampler(64, 4), SimpleNamespace(step=5, gen_batches=5), staleness=1, max_steps=5).close()
    assert link.ops == [("object", "hello")]
    assert worker_ops(1, 5, 5)[0] == [("object", "hello")]


# ---------------------------------------------------------------- stale batches: messages and importance weights
def test_a_batch_crosses_the_link_bit_for_bit():
    exp = tiny_experience(3, [-0.1234567, -2.5, 0.0])
    back = experience_from_message(experience_message(exp))
    assert back.version == 3 and back.prompt_len == 2 and back.src == ["ab"] and back.old_logprobs is None
    for name in ("sequences", "attention_mask", "position_ids", "response_ids", "response_mask", "group_ids",
                 "rollout_logprobs", "ends_with_eos"):
        a, b = getattr(exp, name).numpy(), getattr(back, name).numpy()
        assert a.dtype == b.dtype and np.array_equal(a, b), name


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_importance_weights_of_a_stale_batch(level):
    """Batch 1 of a staleness-1 run was sampled by version 0 with log-probs r; the trainer's
    forward at step 1 gives o. The correction (the same one as the rollout/training mismatch,
    same arguments) weighs each token by exp(o - r) truncated at rollout_is_threshold; by hand:
    token  exp(-0.5 + 1.0) = 1.6487, exp(-1.0 + 3.0) = 7.389 -> 2.0 (truncated), padding 0;
    sequence exp(0.5 + 2.0) = 12.18 -> 2.0 on every real token."""
    staleness, batches = 1, [{"index": 0, "version": 0, "checksum": 100.0, "train_wait_s": 0.0, "gen_batches": 1,
                              "sampler": {"epoch": 0, "offset": 4},
                              "experience": experience_message(tiny_experience(0, [-0.2, -0.2, 0.0]))},
                             {"index": 1, "version": 0, "checksum": 100.0, "train_wait_s": 0.25, "gen_batches": 2,
                              "sampler": {"epoch": 0, "offset": 8},
                              "experience": experience_message(tiny_experience(0, [-1.0, -3.0, 0.0]))}]
    state = SimpleNamespace(step=0, gen_batches=0)
    remote = RemoteRollout(RecordingLink(batches), lambda: [], PromptSampler(64, 4), state, staleness=staleness, max_steps=3)
    remote.generate()
    state.step = 1
    exp = remote.generate()
    assert remote.metrics["async/staleness_mean"] == 1.0 and remote.metrics["async/train_wait_s"] == 0.25
    assert state.gen_batches == 2 and remote.sampler.state_dict() == {"epoch": 0, "offset": 8}
    exp.old_logprobs = paddle.to_tensor([[-0.5, -1.0, 0.0]])
    settings = SimpleNamespace(rollout_is=level, rollout_is_threshold=2.0, rollout_is_lower=None, rollout_is_upper=None)
    stats = AdvantageStage.correct_rollout(SimpleNamespace(settings=settings), exp)
    expected = [[np.exp(0.5), 2.0, 0.0]] if level == "token" else [[2.0, 2.0, 0.0]]
    np.testing.assert_allclose(exp.rollout_is_weights.numpy(), expected, rtol=1e-6)
    assert float(stats["rollout/is_truncated_frac"]) == pytest.approx(0.5 if level == "token" else 1.0)
    direct, _ = rollout_is_weights(exp.old_logprobs, exp.rollout_logprobs, exp.response_mask, rollout_is=level)
    np.testing.assert_array_equal(direct.numpy(), exp.rollout_is_weights.numpy())


# ---------------------------------------------------------------- the weights: versioned, never torn
class ScriptedBroadcast:
    """`dist.broadcast` stand-in for the receiving side: fills each buffer from `arrivals`."""

    def __init__(self, arrivals):
        self.arrivals = list(arrivals)

    def __call__(self, tensor, src=0, group=None):
        tensor.set_value(paddle.to_tensor(self.arrivals.pop(0), dtype=tensor.dtype))


def test_weights_checksum_weights_each_tensor_by_its_position():
    """sum_i (i + 1) x sum(tensor i): [1.] then [2.] -> 1 x 1 + 2 x 2 = 5 (3 without the
    weights, the same for the swapped order that it must tell apart)."""
    assert weights_checksum([paddle.to_tensor([1.0]), paddle.to_tensor([2.0])]) == 5.0
    assert weights_checksum([paddle.to_tensor([2.0]), paddle.to_tensor([1.0])]) == 4.0


def test_weights_are_applied_whole_or_not_at_all(monkeypatch):
    """The receiver splits the flat buffer into the two parameters and checks the checksum of
    the two: version 4 arrives whole and is applied; version 5 (every value doubled) with its
    last value lost is refused and version 4 stays; the same version 5 arriving whole is applied
    (the checksum is the trainer's of the two tensors, so only a torn buffer fails it)."""
    sent = [paddle.to_tensor([[1.5, -2.0], [0.25, 3.0]]), paddle.to_tensor([7.0, 8.0, 9.0])]
    checksum = weights_checksum(sent)
    flat = np.concatenate([t.numpy().reshape(-1) for t in sent])
    params = [paddle.zeros([2, 2]), paddle.zeros([3])]
    monkeypatch.setattr(rollout_link.dist, "broadcast", ScriptedBroadcast([[4.0, checksum], flat]))
    assert RolloutLink().receive_weights(params) == (4, checksum)
    assert all(np.array_equal(p.numpy(), s.numpy()) for p, s in zip(params, sent))
    newer = [s * 2 for s in sent]  # version 5, as the trainer sends it
    newer_checksum = weights_checksum(newer)
    newer_flat = flat * 2
    torn = newer_flat.copy()
    torn[-1] = 0.0  # its last value never arrives
    monkeypatch.setattr(rollout_link.dist, "broadcast", ScriptedBroadcast([[5.0, newer_checksum], torn]))
    with pytest.raises(RuntimeError, match="weights of version 5 arrived torn"):
        RolloutLink().receive_weights(params)
    assert all(np.array_equal(p.numpy(), s.numpy()) for p, s in zip(params, sent))  # version 4 kept whole
    monkeypatch.setattr(rollout_link.dist, "broadcast", ScriptedBroadcast([[5.0, newer_checksum], newer_flat]))
    assert RolloutLink().receive_weights(params) == (5, newer_checksum)
    assert all(np.array_equal(p.numpy(), s.numpy()) for p, s in zip(params, newer))
