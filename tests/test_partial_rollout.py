"""Partial rollouts (`partial_rollout true`): chunked generation that a weight update interrupts,
the per-token weights versions, the per-token staleness and the rollout correction using them."""
import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from ppo.algos.rollout_correction import rollout_correction
from ppo.algos.token_versions import token_staleness, token_staleness_metrics
from ppo.rollout import RolloutEngine, SamplingParams
from ppo.rollout.partial import generate_partial

PAD, EOS = 3, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ppo.tiny.factory import build_tiny

    tok, model = build_tiny(str(tmp_path_factory.mktemp("partial")), seed=7, hidden_size=64, num_layers=2, num_heads=4,
                            intermediate_size=128)
    model.eval()
    texts = ["k3x9q", "ab", "Hello!", "z", "0123456789", "QwErTy"]
    rows = [tok(f"USER: Reverse: {t} ASSISTANT:")["input_ids"] for t in texts]
    T = max(len(r) for r in rows)
    ids, mask = np.full((len(rows), T), PAD, "int64"), np.zeros((len(rows), T), "int64")
    for i, r in enumerate(rows):
        ids[i, T - len(r):], mask[i, T - len(r):] = r, 1
    return model, paddle.to_tensor(ids), paddle.to_tensor(mask)


def _engine(model):
    return RolloutEngine(model, eos_token_id=EOS, pad_token_id=PAD, kernels="paddle")


def _forward_logprobs(model, out, prompt_mask):
    mask = paddle.concat([prompt_mask, paddle.ones_like(out.response_ids)], axis=1)
    with paddle.no_grad():
        logits = model(input_ids=out.sequences, attention_mask=mask, position_ids=(paddle.cumsum(mask, 1) - 1).clip(min=0))
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    lp = F.log_softmax(logits[:, prompt_mask.shape[1] - 1 : -1].astype("float32"), axis=-1)
    return paddle.take_along_axis(lp, out.response_ids.unsqueeze(-1), axis=-1).squeeze(-1)


class Switch:
    """`at_boundary`: before chunk `at`, loads `new` (a state dict) into `model` and moves to version 1."""

    def __init__(self, model, at, new=None):
        self.model, self.at, self.new, self.calls = model, at, new, []

    def __call__(self, chunk):
        self.calls.append(chunk)
        if chunk == self.at and self.new is not None:
            self.model.set_state_dict(self.new)
        return 0 if chunk < self.at else 1


def _perturbed(model, seed=11):
    rng = np.random.default_rng(seed)
    return {k: paddle.to_tensor(v.numpy() + rng.standard_normal(v.shape).astype(v.numpy().dtype) * 0.05)
            for k, v in model.state_dict().items()}


@pytest.mark.parametrize("max_num_seqs", [-1, 4])
def test_chunked_generation_equals_uninterrupted_when_weights_stay(tiny, max_num_seqs):
    """Also with the engine's row chunks (`rollout_max_num_seqs`) inside each token chunk."""
    model, ids, mask = tiny
    engine = RolloutEngine(model, eos_token_id=EOS, pad_token_id=PAD, kernels="paddle", max_num_seqs=max_num_seqs)
    params = SamplingParams(max_new_tokens=12, min_new_tokens=5, temperature=0.9, top_k=20)
    ref = engine.generate(ids, mask, params, seed=5)
    switch = Switch(model, at=2)  # versions change, weights do not
    out, versions = generate_partial(engine, ids, mask, params, 5, chunk_tokens=3, at_boundary=switch)
    np.testing.assert_array_equal(out.response_ids.numpy(), ref.response_ids.numpy())
    np.testing.assert_array_equal(out.response_lengths.numpy(), ref.response_lengths.numpy())
    np.testing.assert_allclose(out.response_logprobs.numpy(), ref.response_logprobs.numpy(), atol=2e-5)
    lengths = ref.response_lengths.numpy()
    assert switch.calls == list(range(int(np.ceil(lengths.max() / 3))))
    v = versions.numpy()
    for b, n in enumerate(lengths):
        expected = [0 if t < 6 else 1 for t in range(n)] + [-1] * (v.shape[1] - n)
        assert v[b].tolist() == expected, b
    assert (v == 1).any() and (v == 0).any()


def test_tokens_after_the_switch_are_the_new_weights_from_that_prefix(tiny):
    model, ids, mask = tiny
    old = {k: paddle.to_tensor(v.numpy()) for k, v in model.state_dict().items()}
    new = _perturbed(model)
    engine = _engine(model)
    params = SamplingParams(max_new_tokens=10, min_new_tokens=10, do_sample=False)
    try:
        before = engine.generate(ids, mask, params)  # the old weights, uninterrupted
        out, versions = generate_partial(engine, ids, mask, params, 1, chunk_tokens=4, at_boundary=Switch(model, 1, new))
        prefix = before.response_ids[:, :4]
        np.testing.assert_array_equal(out.response_ids.numpy()[:, :4], prefix.numpy())
        after = engine.generate(paddle.concat([ids, prefix], 1), paddle.concat([mask, paddle.ones_like(prefix)], 1),
                                SamplingParams(max_new_tokens=6, min_new_tokens=6, do_sample=False))  # new weights
        np.testing.assert_array_equal(out.response_ids.numpy()[:, 4:], after.response_ids.numpy())
        assert (out.response_ids.numpy()[:, 4:] != before.response_ids.numpy()[:, 4:]).any()  # the weights mattered
        assert versions.numpy().tolist() == [[0] * 4 + [1] * 6] * ids.shape[0]
        # each token's log-prob is the one of the weights that sampled it
        lp_new = _forward_logprobs(model, out, mask).numpy()
        model.set_state_dict(old)
        lp_old = _forward_logprobs(model, out, mask).numpy()
        np.testing.assert_allclose(out.response_logprobs.numpy()[:, :4], lp_old[:, :4], atol=1e-4)
        np.testing.assert_allclose(out.response_logprobs.numpy()[:, 4:], lp_new[:, 4:], atol=1e-4)
        assert np.abs(lp_old[:, 4:] - lp_new[:, 4:]).max() > 1e-3
    finally:
        model.set_state_dict(old)


def test_token_staleness_per_token():
    versions = paddle.to_tensor([[3, 3, 4, -1], [4, 4, 4, 4]], dtype="int64")
    mask = paddle.to_tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype="float32")
    assert token_staleness(versions, mask, 4).numpy().tolist() == [[1, 1, 0, 0], [0, 0, 0, 0]]
    m = token_staleness_metrics(versions, mask, 5)
    np.testing.assert_allclose(float(m["async/staleness_mean"]), (2 + 2 + 1 + 4) / 7, rtol=1e-6)
    assert float(m["async/staleness_max"]) == 2.0  # the oldest token's
    np.testing.assert_allclose(float(m["async/fresh_token_frac"]), 5 / 7, rtol=1e-6)
    assert versions.numpy().tolist() == [[3, 3, 4, -1], [4, 4, 4, 4]]  # inputs untouched


def test_correction_uses_each_tokens_behaviour_logprob(tiny):
    """A response spanning versions 0 -> 1, trained under version 1: tokens sampled by version 1
    need no correction (weight 1), those of version 0 get pi_1 / pi_0."""
    model, ids, mask = tiny
    old = {k: paddle.to_tensor(v.numpy()) for k, v in model.state_dict().items()}
    engine = _engine(model)
    params = SamplingParams(max_new_tokens=8, min_new_tokens=8, temperature=1.0)
    try:
        out, versions = generate_partial(engine, ids, mask, params, 9, chunk_tokens=3,
                                         at_boundary=Switch(model, 1, _perturbed(model)))
        train_lp = _forward_logprobs(model, out, mask)  # the trainer's forward: version 1
        w, _ = rollout_correction(train_lp, out.response_logprobs, out.response_mask, rollout_is="token",
                                  rollout_is_threshold=1e9, rollout_is_lower=None, rollout_is_upper=None)
    finally:
        model.set_state_dict(old)
    w, v = w.numpy(), versions.numpy()
    np.testing.assert_allclose(w[v == 1], 1.0, atol=2e-4)
    expected = np.exp(train_lp.numpy() - out.response_logprobs.numpy())[v == 0]
    np.testing.assert_allclose(w[v == 0], expected, rtol=1e-5)
    assert np.abs(w[v == 0] - 1).max() > 1e-3


# ---------------------------------------------------------------- the split run's schedule and refusals
from types import SimpleNamespace  # noqa: E402

from ppo.common.argument_problems import ArgumentError  # noqa: E402
from ppo.data.prompt_sampler import PromptSampler  # noqa: E402
from ppo.entry.rollout_placement_arguments import rollout_placement_problems  # noqa: E402
from ppo.run_ppo import build_trainer  # noqa: E402
from ppo.trainer.remote_rollout import RemoteRollout  # noqa: E402
from ppo.trainer.rollout_worker import RolloutWorker, RolloutWorkerState  # noqa: E402
from tests.rule_reward_helpers import rule_argv  # noqa: E402
from ppo.strategy.rollout_layout import RolloutLayout  # noqa: E402
from tests.test_async_rollout import RecordingLink, placement_args, tiny_experience  # noqa: E402


class ChunkedFakeRollout:
    """A `Rollout` with a `partial` switch: three chunks of one token each, versions from the
    boundaries (`generate_chunks`, the generator a rollout rank drives); `log` records each chunk
    generated as `(name, chunk, version)`."""

    def __init__(self, chunks=3, name=0, log=None):
        self.state, self.sampler, self.partial, self.chunks = RolloutWorkerState(), PromptSampler(64, 4, seed=1), None, chunks
        self.name, self.log = name, log if log is not None else []

    def generate_chunks(self):
        self.sampler.next_indices()
        assert [self.partial.chunk_tokens(c) for c in range(2)] == [1, 1 << 30]
        versions = []
        for c in range(self.chunks):
            versions.append((yield c))
            self.log.append((self.name, c, versions[-1]))
        self.state.gen_batches += 1
        exp = tiny_experience(self.state.step, [-1.0, -2.0, 0.0])
        exp.token_versions = paddle.to_tensor([versions[:2] + [-1]], dtype="int64")  # 2 real tokens, then padding
        return exp

    def skip(self):
        self.sampler.next_indices()
        self.state.gen_batches += 1


@pytest.mark.parametrize("staleness", [1, 2])
@pytest.mark.parametrize("start", [0, 3])
def test_partial_schedule_pairs_up_and_batches_span_one_update(staleness, start):
    """Trainer and rollout rank pair their collectives one for one; batch b >= start + s starts
    under version b - s and takes b - s + 1 after its first chunk; no token is over s stale."""
    max_steps = 7
    link = RecordingLink([{"start": start, "max_steps": max_steps, "gen_batches": start, "sampler": {"epoch": 0, "offset": 0}},
                          *range(start, max_steps - staleness + 1)], rank=1)
    RolloutWorker(link, {0: ChunkedFakeRollout()}, [], staleness, partial_tokens=1).train()
    trainer_link = RecordingLink(link.sent_objects)
    state = SimpleNamespace(step=start, gen_batches=start)
    remote = RemoteRollout(trainer_link, lambda: [], PromptSampler(64, 4, seed=1), state, staleness=staleness, max_steps=max_steps, partial=True)
    for step in range(start, max_steps):
        exp = remote.generate()
        first, second = exp.token_versions.numpy()[0, :2].tolist()
        expected = [max(start, step - staleness), max(start, step - staleness + 1)]
        assert [first, second] == expected, step
        assert exp.version == expected[0]
        assert remote.metrics["async/staleness_max"] == step - expected[0] <= staleness
        np.testing.assert_allclose(remote.metrics["async/staleness_mean"], step - (first + second) / 2)
        state.step += 1
    assert trainer_link.ops == link.ops and not trainer_link.inbox and not link.inbox


class RoutedLink(RecordingLink):
    """A `RecordingLink` of one rank of `layout` that also records where each object went."""

    def __init__(self, layout, inbox=(), rank=0):
        super().__init__(inbox, rank)
        self.layout, self.routed = layout, []

    def send_object(self, obj, dst, what=""):
        super().send_object(obj, dst, what)
        self.routed.append((dst, obj))


@pytest.mark.parametrize("world, rollout_ranks", [(3, 1), (3, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("staleness", [1, 2])
def test_partial_schedule_of_many_ranks(world, rollout_ranks, staleness):
    """N trainer x M rollout ranks: every rollout rank takes every version once, in order (also
    one that generates nothing in that step: the broadcast reaches them all); a rollout rank
    holding several units of a step generates their first chunks, takes the update once, then
    finishes them all, so every unit of batch b >= s carries versions b - s then b - s + 1
    whichever rank generated it (the batches of one trainer beside one rollout rank), and each
    trainer rank receives its units in step order with no token over s steps stale."""
    layout, start, max_steps = RolloutLayout(world, rollout_ranks), 0, 6
    versions = list(range(start, max_steps - staleness + 1))
    sent = []
    for rank in layout.replica_ranks:
        served = layout.served_data_ranks(rank)
        hello = {"start": start, "max_steps": max_steps, "gen_batches": start, "sampler": {"epoch": 0, "offset": 0}}
        link, log = RoutedLink(layout, [hello] * len(served) + versions, rank=rank), []
        RolloutWorker(link, {d: ChunkedFakeRollout(name=d, log=log) for d in served}, [], staleness, partial_tokens=1).train()
        assert [v for op, v in link.ops if op == "weights"] == versions and not link.inbox, rank
        at = 0
        for b in range(start, max_steps):  # the units of one step: first chunks, the update, the rest
            mine = [d for d, leader in layout.units(b) if leader == rank]
            chunks, at = log[at:at + 3 * len(mine)], at + 3 * len(mine)
            old, new = max(start, b - staleness), max(start, b - staleness + 1)
            assert chunks == [(d, c, old if c == 0 else new) for c in range(3) for d in mine], (rank, b, log)
        assert at == len(log)
        sent += link.routed
    for t in layout.trainer_ranks:
        inbox = sorted((obj for dst, obj in sent if dst == t), key=lambda m: m["index"])
        state = SimpleNamespace(step=start, gen_batches=start)
        remote = RemoteRollout(RoutedLink(layout, inbox, rank=t), lambda: [], PromptSampler(64, 4, seed=1), state,
                               staleness=staleness, max_steps=max_steps, partial=True)
        for step in range(start, max_steps):
            exp = remote.generate()
            expected = [max(start, step - staleness), max(start, step - staleness + 1)]
            assert exp.token_versions.numpy()[0, :2].tolist() == expected, (t, step)
            assert remote.metrics["async/staleness_max"] == step - expected[0] <= staleness
            state.step += 1


@pytest.mark.parametrize("changes, key", [
    ({"async_staleness": 0}, "partial_rollout needs rollout_placement split with async_staleness >= 1"),
    ({"rollout_placement": "colocated", "async_staleness": 0}, "partial_rollout needs rollout_placement split"),
    ({"partial_rollout_tokens": 16}, "partial_rollout_tokens 16 must be in 1..max_dec_len - 1 (15)"),
    ({"partial_rollout_tokens": 0}, "partial_rollout_tokens 0 must be in"),
    ({"moe_routing_replay": "rollout"}, "moe_routing_replay rollout with partial_rollout"),
])
def test_partial_rollout_problems_name_the_key(changes, key):
    base = dict(async_staleness=1, rollout_is="token", partial_rollout=True, partial_rollout_tokens=4, max_dec_len=16)
    args = placement_args(**{**base, **changes})
    problems = rollout_placement_problems(args, 2 if args.split_rollout else 1)
    assert any(key in p for p in problems), problems
    assert rollout_placement_problems(placement_args(**base), 2) == []


def test_partial_rollout_refused_before_models_load(tiny_model_dir, tiny_data_dir, tmp_path):
    argv = rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "o"), "--partial_rollout", "true")
    with pytest.raises(ArgumentError) as err:
        build_trainer(argv)
    assert "partial_rollout needs rollout_placement split with async_staleness >= 1" in str(err.value)
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_token_versions_cross_the_link_and_pad_with_minus_one():
    from ppo.experience import pad_experience
    from ppo.trainer.remote_rollout import experience_from_message, experience_message

    exp = tiny_experience(2, [-1.0, -2.0, 0.0])
    exp.token_versions = paddle.to_tensor([[2, 3, -1]], dtype="int64")
    back = experience_from_message(experience_message(exp))
    assert back.token_versions.numpy().tolist() == [[2, 3, -1]] and back.token_versions.dtype == paddle.int64
    wide = pad_experience(back, 3, 5, 0)
    assert wide.token_versions.numpy().tolist() == [[2, 3, -1, -1, -1]]
    assert back.select([0]).token_versions.numpy().tolist() == [[2, 3, -1]]
