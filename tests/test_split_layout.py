"""N trainer ranks beside M rollout ranks (`rollout_placement split`, `rollout_ranks` M): the fixed
deal of the batches (ppo/strategy/rollout_layout.py), the process groups made of it
(ppo/strategy/split_groups.py), the placements accepted and refused, and the schedule every
trainer and rollout rank follows, run with recording links: trainer rank t gets exactly colocated
data rank t's draws, each from the rollout rank dealt it, and every exchange pairs up. The
launched runs against the colocated runs: tests/test_split_many_launch.py."""
from types import SimpleNamespace

import paddle
import pytest

from ppo.data.prompt_sampler import PromptSampler
from ppo.entry.rollout_placement_arguments import rollout_placement_problems
from ppo.strategy import rollout_link, split_groups
from ppo.strategy.rollout_layout import RolloutLayout
from ppo.strategy.rollout_link import RolloutLink, weights_checksum
from ppo.trainer.remote_rollout import RemoteRollout
from ppo.trainer.rollout_worker import RolloutWorker, RolloutWorkerState
from tests.test_async_rollout import placement_args, tiny_experience


# ---------------------------------------------------------------- the deal and the groups
def test_units_are_dealt_round_robin_in_a_fixed_order():
    """Unit (b, t) goes to replica (b * N + t) mod M, numbered after the N trainer ranks."""
    two_two = RolloutLayout(4, 2)
    assert (two_two.trainers, two_two.trainer_ranks, two_two.replica_ranks) == (2, [0, 1], [2, 3])
    assert [two_two.units(b) for b in range(3)] == [[(0, 2), (1, 3)]] * 3  # trainer t paired with replica t
    assert two_two.weight_group_ranks == [0, 2, 3]
    two_one = RolloutLayout(3, 1)
    assert [two_one.units(b) for b in range(2)] == [[(0, 2), (1, 2)]] * 2  # trainer 0's batch, then trainer 1's
    assert two_one.served_trainers(2) == [0, 1] and two_one.weight_group_ranks == [0, 2]
    one_two = RolloutLayout(3, 2)
    assert [one_two.replica_of(b, 0) for b in range(5)] == [1, 2, 1, 2, 1]  # the replicas take turns
    assert one_two.served_trainers(1) == one_two.served_trainers(2) == [0]
    three_two = RolloutLayout(5, 2)
    assert three_two.units(0) == [(0, 3), (1, 4), (2, 3)] and three_two.units(1) == [(0, 4), (1, 3), (2, 4)]
    assert three_two.served_trainers(3) == three_two.served_trainers(4) == [0, 1, 2]
    assert [RolloutLayout(2, 1).units(b) for b in range(2)] == [[(0, 1)]] * 2  # the one-and-one run


def test_tensor_parallel_groups_count_once_in_the_deal():
    """A trainer tensor-parallel group is one data rank: its units go to one replica and come to
    each of its ranks; a replica of rollout_tp ranks is one replica whose first rank (its leader)
    is named in the deal."""
    tp_trainer = RolloutLayout(4, 2, trainer_tp=2)  # ranks 0-1 train together, 2 and 3 are replicas
    assert (tp_trainer.data_ranks, tp_trainer.replicas, tp_trainer.data_rank_trainers(0)) == (1, 2, [0, 1])
    assert [tp_trainer.units(b) for b in range(3)] == [[(0, 2)], [(0, 3)], [(0, 2)]]  # the replicas take turns
    assert tp_trainer.served_trainers(2) == tp_trainer.served_trainers(3) == [0, 1]
    assert [tp_trainer.data_rank(t) for t in (0, 1)] == [0, 0] and tp_trainer.weight_group_ranks == [0, 2, 3]
    tp_replica = RolloutLayout(3, 2, rollout_tp=2)  # rank 0 trains, ranks 1-2 are one replica
    assert (tp_replica.data_ranks, tp_replica.replicas) == (1, 1)
    assert [tp_replica.units(b) for b in range(2)] == [[(0, 1)]] * 2
    assert [tp_replica.leader(r) for r in (1, 2)] == [1, 1] and tp_replica.replica_members(2) == [1, 2]
    assert tp_replica.served_trainers(1) == tp_replica.served_trainers(2) == [0]
    both = RolloutLayout(8, 4, trainer_tp=2, rollout_tp=2)  # data ranks {0, 1} and {2, 3}; replicas 4-5 and 6-7
    assert [both.units(b) for b in range(2)] == [[(0, 4), (1, 6)]] * 2
    assert both.served_trainers(7) == [2, 3] and both.served_data_ranks(5) == [0]


@pytest.mark.parametrize("layout, replica, data", [
    (RolloutLayout(4, 2, trainer_tp=2), {}, {}),  # one data rank, replicas of one rank: no group of either
    (RolloutLayout(3, 2, rollout_tp=2), {1: [1, 2], 2: [1, 2]}, {}),
    (RolloutLayout(8, 4, trainer_tp=2, rollout_tp=2), {4: [4, 5], 5: [4, 5], 6: [6, 7], 7: [6, 7]},
     {0: [0, 2], 2: [0, 2], 1: [1, 3], 3: [1, 3]}),
])
def test_parallel_groups_of_replicas_and_trainer_data_ranks(monkeypatch, layout, replica, data):
    """Each replica of several ranks generates over a group of its own; with several trainer data
    ranks of tensor parallelism, the ranks of one model-parallel index sum gradients over theirs."""
    monkeypatch.setattr(split_groups, "isolated_group", lambda ranks, name: list(ranks))
    assert split_groups.parallel_groups(layout) == (replica, data)


@pytest.mark.parametrize("world, rollout_ranks, want, made", [
    (2, 1, (None, [None], {(0, 1): None}), []),  # the launch is the pair: Paddle's default group
    (4, 2, ([0, 1], [[0, 2, 3]], {(0, 2): [0, 2], (1, 3): [1, 3]}),
     [("trainers", [0, 1]), ("weights", [0, 2, 3]), ("pair_0_2", [0, 2]), ("pair_1_3", [1, 3])]),
    (3, 1, ([0, 1], [[0, 2]], {(0, 2): [0, 2], (1, 2): [1, 2]}),
     [("trainers", [0, 1]), ("weights", [0, 2]), ("pair_0_2", [0, 2]), ("pair_1_2", [1, 2])]),
    (3, 2, (None, [None], {(0, 1): [0, 1], (0, 2): [0, 2]}),  # one trainer; the weights group is the launch
     [("pair_0_1", [0, 1]), ("pair_0_2", [0, 2])]),
])
def test_split_groups_are_made_in_one_order_on_every_rank(monkeypatch, world, rollout_ranks, want, made):
    """The trainer ranks' group, the weights group (trainer rank 0 and the rollout ranks) and one
    group per trainer/rollout pair that exchanges batches, each under a store key of its own;
    Paddle's default group where a group would be the whole launch or one rank."""
    calls = []
    monkeypatch.setattr(split_groups, "isolated_group", lambda ranks, name: calls.append((name, ranks)) or list(ranks))
    assert split_groups.split_groups(RolloutLayout(world, rollout_ranks)) == want
    assert calls == made


def test_each_rank_of_a_trainer_tensor_parallel_group_pairs_with_each_replica(monkeypatch):
    """Trainer TP2 beside two replicas: every trainer rank receives batches from both replicas."""
    calls = []
    monkeypatch.setattr(split_groups, "isolated_group", lambda ranks, name: calls.append(name) or list(ranks))
    trainers, weights, pairs = split_groups.split_groups(RolloutLayout(4, 2, trainer_tp=2))
    assert (trainers, weights, sorted(pairs)) == ([0, 1], [[0, 2, 3]], [(0, 2), (0, 3), (1, 2), (1, 3)])
    assert calls == ["trainers", "weights", "pair_0_2", "pair_1_2", "pair_0_3", "pair_1_3"]
    calls.clear()  # beside one TP2 replica: rank 3 only gets trainer rank 0's hello, rank 2 sends to both
    _, weights, pairs = split_groups.split_groups(RolloutLayout(4, 2, trainer_tp=2, rollout_tp=2))
    assert sorted(pairs) == [(0, 2), (0, 3), (1, 2)] and weights == [[0, 2], [0, 3]]  # slice j: rank j of the replica
    assert calls == ["trainers", "weights_0", "weights_1", "pair_0_2", "pair_1_2", "pair_0_3"]


def test_each_slice_of_the_weights_goes_to_rank_j_of_every_replica():
    """Two replicas of TP2 beside two trainer ranks: slice 0 to ranks 2 and 4, slice 1 to 3 and 5."""
    layout = RolloutLayout(6, 4, rollout_tp=2)
    assert [layout.weight_shard_ranks(j) for j in (0, 1)] == [[0, 2, 4], [0, 3, 5]]
    assert [layout.weight_shard(r) for r in layout.replica_ranks] == [0, 1, 0, 1]
    assert RolloutLayout(4, 2).weight_shard_ranks(0) == RolloutLayout(4, 2).weight_group_ranks == [0, 2, 3]


def test_only_trainer_rank_0_broadcasts_the_weights(monkeypatch):
    """Trainer rank 1 holds the same weights (data parallel): it sends nothing and notes their checksum."""
    def broadcast(*args, **kwargs):
        raise AssertionError("trainer rank 1 joined the weights broadcast")

    monkeypatch.setattr(rollout_link.dist, "broadcast", broadcast)
    params = [paddle.to_tensor([1.0, 2.0]), paddle.to_tensor([3.0])]
    assert RolloutLink(RolloutLayout(4, 2), rank=1).send_weights(params, 3) == weights_checksum(params) == 9.0


# ---------------------------------------------------------------- the placements
@pytest.mark.parametrize("world, rollout_ranks", [(4, 2), (3, 1), (3, 2), (5, 2)])
def test_more_than_one_trainer_or_rollout_rank_is_accepted(world, rollout_ranks):
    assert rollout_placement_problems(placement_args(rollout_ranks=rollout_ranks), world) == []
    stale = placement_args(rollout_ranks=rollout_ranks, async_staleness=1, rollout_is="token")
    assert rollout_placement_problems(stale, world) == []


def test_what_stays_refused_with_more_ranks_names_its_key():
    args = placement_args(rollout_ranks=2, async_staleness=1, rollout_is="token", partial_rollout=True,
                          partial_rollout_tokens=2, max_dec_len=8, tensor_parallel_degree=2, rollout_tensor_parallel_degree=2)
    assert rollout_placement_problems(args, 4) == []  # partial rollouts beside any trainer layout and replicas
    for world, rollout_ranks, tp, rollout_tp in ((6, 2, 2, 1), (4, 2, 1, 1), (3, 1, 1, 1), (3, 2, 1, 1), (3, 2, 1, 2)):
        args.rollout_ranks, args.tensor_parallel_degree, args.rollout_tensor_parallel_degree = rollout_ranks, tp, rollout_tp
        assert rollout_placement_problems(args, world) == [], (world, rollout_ranks, tp, rollout_tp)
    # tensor_parallel_degree 2 on 2 trainer ranks of 4 processes runs, so do replicas of 2 ranks
    for name in ("pipeline_parallel_degree", "sharding_parallel_degree"):
        problems = rollout_placement_problems(placement_args(rollout_ranks=2, **{name: 2}), 4)
        assert problems == [f"{name} 2 with rollout_placement split: the trainer ranks train data and tensor parallel "
                            "only (pipeline stages and sharding beside rollout ranks are not implemented)"]


@pytest.mark.parametrize("rollout_ranks, ok", [(2, True), (4, True), (3, False), (1, False)])
def test_rollout_tensor_parallel_needs_rollout_ranks_that_divide_by_it(rollout_ranks, ok):
    args = placement_args(rollout_ranks=rollout_ranks, rollout_tensor_parallel_degree=2)
    assert rollout_placement_problems(args, 5) == ([] if ok else [
        f"rollout_tensor_parallel_degree 2 with rollout_placement split needs rollout_ranks ({rollout_ranks}) to divide "
        "by it (each replica is that many consecutive rollout ranks)"])


@pytest.mark.parametrize("world, rollout_ranks, ok", [(4, 2, True), (6, 2, True), (3, 1, False), (4, 1, False)])
def test_trainer_tensor_parallel_needs_trainer_ranks_that_divide_by_it(world, rollout_ranks, ok):
    problems = rollout_placement_problems(placement_args(rollout_ranks=rollout_ranks, tensor_parallel_degree=2), world)
    assert problems == ([] if ok else [f"tensor_parallel_degree 2 with rollout_placement split needs the trainer ranks "
                                       f"({world - rollout_ranks}) and the launch's processes ({world}) to divide by it "
                                       "(fleet's topology spans the whole launch)"])


# ---------------------------------------------------------------- the schedule, with routed recording links
class RoutedLink:
    """A `RolloutLink` stand-in for one rank: objects from and to each peer in order, the weights
    versions it is handed (a rollout rank), and every operation with its peer."""

    trainer_rank = 0

    def __init__(self, layout, rank, inbox=None, versions=()):
        self.layout, self.rank, self.inbox, self.versions = layout, rank, dict(inbox or {}), list(versions)
        self.outbox, self.ops = {}, []

    def send_object(self, obj, dst, what=""):
        self.ops.append((dst, "object", obj.get("index", "hello")))
        self.outbox.setdefault(dst, []).append(obj)

    def recv_object(self, src, what=""):
        message = self.inbox[src].pop(0)
        self.ops.append((src, "object", message.get("index", "hello")))
        return message

    def send_weights(self, params, version):
        self.ops.append((None, "weights", version))
        return 100.0 + version

    def receive_weights(self, params):
        version = self.versions.pop(0)
        self.ops.append((None, "weights", version))
        return version, 100.0 + version


class DataRankRollout:
    """A `Rollout` stand-in drawing as colocated data rank `t` of `n` would: each batch names its
    data rank and draw, and carries the first prompt index drawn as its group id."""

    def __init__(self, t, n):
        self.t, self.state, self.sampler = t, RolloutWorkerState(), PromptSampler(64, 4, t, n, seed=1)

    def generate(self):
        first = self.sampler.next_indices()[0]
        exp = tiny_experience(self.state.step, [-1.0, -2.0, 0.0])
        exp.src, exp.group_ids = [f"rank {self.t} draw {self.state.gen_batches}"], paddle.to_tensor([first], dtype="int64")
        self.state.gen_batches += 1
        return exp

    def skip(self):
        self.sampler.next_indices()
        self.state.gen_batches += 1


def colocated_draws(t, n, count):
    sampler = PromptSampler(64, 4, t, n, seed=1)
    return [sampler.next_indices()[0] for _ in range(count)]


def run_schedule(layout, staleness, start, max_steps):
    """Every rollout rank's loop, then every trainer rank's steps, over routed links; returns
    `({trainer: [its experiences]}, {trainer: its link}, {replica: its link})`. A data rank's
    hello comes from its first trainer rank; every rank of a replica walks the units."""
    n, sent_versions = layout.data_ranks, [start] + [k for k in range(start + 1, max_steps) if k + staleness < max_steps]
    hellos = {}
    for d in range(n):
        sampler = PromptSampler(64, 4, d, n, seed=1)
        for _ in range(start):
            sampler.next_indices()
        hellos[d] = {"start": start, "max_steps": max_steps, "gen_batches": start, "sampler": sampler.state_dict()}
    replicas = {}
    for r in layout.replica_ranks:
        served = layout.served_data_ranks(r)
        replicas[r] = RoutedLink(layout, r, {layout.data_rank_trainers(d)[0]: [hellos[d]] for d in served}, sent_versions)
        RolloutWorker(replicas[r], {d: DataRankRollout(d, n) for d in served}, [], staleness).train()
        assert not replicas[r].versions  # every version sent was taken
    got, trainers = {}, {}
    for t in layout.trainer_ranks:
        trainers[t] = RoutedLink(layout, t, {r: list(link.outbox.get(t, [])) for r, link in replicas.items()})
        state, d = SimpleNamespace(step=start, gen_batches=start), layout.data_rank(t)
        remote = RemoteRollout(trainers[t], lambda: [], PromptSampler(64, 4, d, n, seed=1), state, staleness=staleness,
                               max_steps=max_steps)
        got[t] = []
        for _ in range(start, max_steps):
            got[t].append(remote.generate())
            assert remote.metrics["async/staleness_mean"] == state.step - got[t][-1].version
            state.step += 1
        assert state.gen_batches == max_steps and not any(trainers[t].inbox.values())
    return got, trainers, replicas


@pytest.mark.parametrize("layout", [RolloutLayout(4, 2), RolloutLayout(3, 1), RolloutLayout(3, 2), RolloutLayout(5, 2),
                                    RolloutLayout(2, 1), RolloutLayout(4, 2, trainer_tp=2), RolloutLayout(3, 2, rollout_tp=2),
                                    RolloutLayout(8, 4, trainer_tp=2, rollout_tp=2), RolloutLayout(7, 4, rollout_tp=2)],
                         ids=lambda lay: f"{lay.trainers}x{lay.rollout_ranks}-tp{lay.trainer_tp}-rtp{lay.rollout_tp}")
@pytest.mark.parametrize("staleness", [0, 1, 2])
@pytest.mark.parametrize("start", [0, 3])
def test_every_trainer_rank_gets_its_colocated_draws_from_the_rank_dealt_them(layout, staleness, start):
    """Trainer rank t's batch b is colocated data rank d(t)'s draw b (its prompts, its seed count;
    d(t) = t // trainer_tp), sampled by version max(start, b - staleness), received from the leader
    of replica_of(b, d(t)); each pair's exchanges match one for one, and trainer rank 0's weights
    go to every rollout rank in order."""
    max_steps = 7
    got, trainers, replicas = run_schedule(layout, staleness, start, max_steps)
    for t, batches in got.items():
        d = layout.data_rank(t)
        draws = colocated_draws(d, layout.data_ranks, max_steps)
        assert [e.src[0] for e in batches] == [f"rank {d} draw {b}" for b in range(start, max_steps)]
        assert [int(e.group_ids.numpy()[0]) for e in batches] == draws[start:]
        assert [e.version for e in batches] == [max(start, b - staleness) for b in range(start, max_steps)]
        received = [(peer, index) for peer, kind, index in trainers[t].ops if kind == "object" and index != "hello"]
        assert received == [(layout.replica_of(b, d), b) for b in range(start, max_steps)]
    for r, link in replicas.items():
        for t in layout.served_trainers(r):
            mine = [(kind, index) for peer, kind, index in link.ops if peer == t]
            theirs = [(kind, index) for peer, kind, index in trainers[t].ops if peer == r]
            assert mine == theirs  # hello, then the batches dealt to r, in step order
        assert [op for op in link.ops if op[1] == "weights"] == [op for op in trainers[0].ops if op[1] == "weights"]


def test_a_rollout_rank_refuses_trainer_ranks_that_start_apart():
    """Trainer ranks resumed from different checkpoints would ask for different batches: stop, naming both."""
    layout = RolloutLayout(3, 1)
    hello = {"max_steps": 5, "gen_batches": 0, "sampler": {"epoch": 0, "offset": 0}}
    link = RoutedLink(layout, 2, {0: [{**hello, "start": 2}], 1: [{**hello, "start": 3}]}, [2])
    worker = RolloutWorker(link, {t: DataRankRollout(t, 2) for t in (0, 1)}, [], 0)
    with pytest.raises(RuntimeError, match=r"start at different \(step, max_steps\): \{0: \(2, 5\), 1: \(3, 5\)\}"):
        worker.train()
