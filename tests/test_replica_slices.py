"""A split run's rollout replica of tensor-parallel degree 2 holds and receives only its slices:
trainer rank 0 cuts the whole weights by the model's own mappings and broadcasts slice j to rank j
of the replica (`RolloutLink.send_weights` / `receive_weights` with a recording broadcast in one
process), each rank's parameters are exactly its slice of the trainer's weights, their bytes are
half the whole tensor-parallel weights' (replicated ones whole), and the engine reads the same
weights from the held slices as it cut from the whole model before."""
import numpy as np
import paddle
import pytest

from ppo.models.adapters import load_causal_lm
from ppo.models.tensor_slices import merge, split
from ppo.rollout.tp_weights import hold_slices, parameter_bytes, weight_source
from ppo.rollout.weights import extract_weights
from ppo.strategy import rollout_link
from ppo.strategy.rollout_layout import RolloutLayout
from ppo.strategy.rollout_link import RolloutLink, weights_checksum

LAYOUT = RolloutLayout(3, 2, rollout_tp=2)  # trainer rank 0; ranks 1 and 2 are one replica of TP2
GROUPS = ["slice_0", "slice_1"]  # stand-ins of the two weights groups


class RecordedBroadcast:
    """`dist.broadcast` stand-in: the sender records each buffer by group, a receiver replays its group's."""

    def __init__(self, sent=None):
        self.sent, self.groups = sent if sent is not None else {}, []

    def __call__(self, tensor, src=0, group=None):
        self.groups.append(group)
        queue = self.sent.setdefault(group, [])
        if src == self.rank:
            queue.append(tensor.numpy().copy())
        else:
            tensor.set_value(paddle.to_tensor(queue.pop(0), dtype=tensor.dtype))


def trained_weights(path):
    """The tiny model with weights unlike the file's (as after some optimiser steps)."""
    model = load_causal_lm(path)
    with paddle.no_grad():
        for i, p in enumerate(model.parameters()):
            p.set_value(p + 0.01 * (i + 1) * paddle.cos(paddle.arange(int(p.numel()), dtype=p.dtype)).reshape(p.shape))
    return model


def sent_weights(monkeypatch, trainer, version):
    """`(what trainer rank 0 broadcast per group, checksum it returned)`."""
    record = RecordedBroadcast()
    record.rank = 0
    monkeypatch.setattr(rollout_link.dist, "broadcast", record)
    link = RolloutLink(LAYOUT, rank=0, weight_groups=GROUPS)
    link.plan_slices(trainer)
    checksum = link.send_weights(list(trainer.parameters()), version)
    assert set(record.groups) == set(GROUPS)
    return record.sent, checksum


def replica_rank(monkeypatch, path, shard, sent):
    """Rank `shard` of the replica: the model loaded, cut to its slice, then the sent weights received."""
    model = load_causal_lm(path)
    kinds, sizes = hold_slices(model, shard, 2)
    replay = RecordedBroadcast({g: list(q) for g, q in sent.items()})
    replay.rank = 1 + shard
    monkeypatch.setattr(rollout_link.dist, "broadcast", replay)
    got = RolloutLink(LAYOUT, rank=1 + shard, weight_groups=GROUPS).receive_weights(list(model.parameters()))
    assert set(replay.groups) == {GROUPS[shard]}  # only its own slice's group
    return model, kinds, sizes, got


def test_each_replica_rank_holds_exactly_its_slice_of_the_trainers_weights(monkeypatch, tiny_model_dir):
    trainer = trained_weights(tiny_model_dir)
    whole = [p.numpy() for p in trainer.parameters()]
    sent, checksum = sent_weights(monkeypatch, trainer, 7)
    assert checksum == weights_checksum(list(trainer.parameters()))
    ranks = [replica_rank(monkeypatch, tiny_model_dir, shard, sent) for shard in (0, 1)]
    kinds = ranks[0][1]
    assert {"column", "row"} <= set(kinds) and "replicated" in kinds  # q/k/v/gate/up/head, o/down/embedding; norms
    for shard, (model, _, sizes, got) in enumerate(ranks):
        assert got == (7, checksum)  # the version and the whole weights' checksum, verified on the slice
        for p, w, kind in zip(model.parameters(), whole, kinds):
            assert np.array_equal(p.numpy(), split(w, kind, 2)[shard])  # exactly its slice (replicated: whole)
        params = list(model.parameters())
        cut = [p for p, k in zip(params, kinds) if k != "replicated"]
        replicated = [p for p, k in zip(params, kinds) if k == "replicated"]
        whole_cut = sum(w.nbytes for w, k in zip(whole, kinds) if k != "replicated")
        assert parameter_bytes(cut) * 2 == whole_cut == sizes["whole_tensor_parallel_bytes"]
        assert parameter_bytes(replicated) == sum(w.nbytes for w, k in zip(whole, kinds) if k == "replicated")
        assert sizes["parameter_bytes"] == parameter_bytes(params) == whole_cut // 2 + parameter_bytes(replicated)
        assert sizes["whole_parameter_bytes"] == sum(w.nbytes for w in whole)
        assert parameter_bytes(params) < 0.55 * sizes["whole_parameter_bytes"]
    for i, kind in enumerate(kinds):  # the two ranks' slices put back together are the trainer's weights
        assert np.array_equal(merge([list(m.parameters())[i].numpy() for m, *_ in ranks], kind), whole[i])


def test_a_torn_slice_is_refused_and_a_wrong_size_named(monkeypatch, tiny_model_dir):
    trainer = trained_weights(tiny_model_dir)
    sent, _ = sent_weights(monkeypatch, trainer, 3)
    model = load_causal_lm(tiny_model_dir)
    hold_slices(model, 1, 2)
    before = [p.numpy().copy() for p in model.parameters()]
    torn = {g: [a.copy() for a in q] for g, q in sent.items()}
    torn["slice_1"][-1][-1] += 1.0  # the last value of slice 1 arrives changed
    replay = RecordedBroadcast(torn)
    replay.rank = 2
    monkeypatch.setattr(rollout_link.dist, "broadcast", replay)
    with pytest.raises(RuntimeError, match="weights of version 3 arrived torn"):
        RolloutLink(LAYOUT, rank=2, weight_groups=GROUPS).receive_weights(list(model.parameters()))
    assert all(np.array_equal(p.numpy(), b) for p, b in zip(model.parameters(), before))  # nothing applied
    whole = load_causal_lm(tiny_model_dir)  # a rank that kept the whole weights cannot take a slice
    replay = RecordedBroadcast({g: list(q) for g, q in sent.items()})
    replay.rank = 2
    monkeypatch.setattr(rollout_link.dist, "broadcast", replay)
    with pytest.raises(RuntimeError, match="values of slice 1, this rank holds"):
        RolloutLink(LAYOUT, rank=2, weight_groups=GROUPS).receive_weights(list(whole.parameters()))


class Group:
    def __init__(self, rank, nranks):
        self.rank, self.nranks = rank, nranks


def test_the_engine_reads_the_held_slices_as_it_cut_them_from_the_whole_model(tiny_model_dir):
    """The engine's weights of rank r (fused q/k/v, o, MLP, embedding and head slices, the
    vocabulary start) are the same from the held slices as from the whole model it cut them from."""
    for shard in (0, 1):
        whole, held = load_causal_lm(tiny_model_dir), load_causal_lm(tiny_model_dir)
        hold_slices(held, shard, 2)
        a = extract_weights(whole, sharded=True, group=Group(shard, 2))
        b = extract_weights(held, sharded=True, group=Group(shard, 2))
        assert (a.num_heads, a.vocab_size, a.shard.vocab_start) == (b.num_heads, b.vocab_size, b.shard.vocab_start)
        assert a.shard.embed_sharded and a.shard.head_sharded and b.shard.vocab_start == shard * a.embed.shape[0]
        pairs = [(a.embed, b.embed), (a.lm_head, b.lm_head), (a.norm, b.norm)]
        for la, lb in zip(a.layers, b.layers):
            pairs += [(getattr(la, k), getattr(lb, k)) for k in ("qkv", "o", "gate_up", "gate", "up", "down") if getattr(la, k) is not None]
        assert all(np.array_equal(x.numpy(), y.numpy()) for x, y in pairs)
    with pytest.raises(RuntimeError, match="holds only the tensor-parallel slices"):
        weight_source(held)  # a held model read as whole would be wrong: refused


def test_a_lora_actor_stays_whole_on_every_replica_rank(tiny_model_dir):
    """Its adapter's product adds to whole weights (and with a KL its disabled adapter is the
    reference's forward): every kind replicated, nothing cut, the trainer sends it whole."""
    from ppo.models.loading import apply_lora

    model = apply_lora(load_causal_lm(tiny_model_dir), rank=2, alpha=4)
    before = parameter_bytes(model.parameters())
    kinds, sizes = hold_slices(model, 1, 2)
    assert set(kinds) == {"replicated"} and len(kinds) == len(list(model.parameters()))
    assert sizes["parameter_bytes"] == sizes["whole_parameter_bytes"] == before
    weight_source(model.model, group=None)  # not marked as holding slices
