"""The beacons and the verdict of ppo.common.rank_faults in one process: a rank whose port is
closed is found dead (a listening one alive, a closed one refused), the verdict names it with the
failed exchange's detail, and no failure with every rank alive gives no verdict. The launches
that kill ranks are tests/test_split_faults_launch.py."""
import socket

import pytest

from ppo.common import rank_faults
from ppo.common.run_guard import RolloutRankLost
from ppo.strategy.rollout_layout import RolloutLayout


@pytest.fixture
def beacons(monkeypatch):
    """Ranks 1..3 of a 2 + 2 launch listening on ports of their own (rank 0 is this process)."""
    socks = {}
    for r in (1, 2, 3):
        socks[r] = socket.socket()
        socks[r].bind(("127.0.0.1", 0))
        socks[r].listen(8)
    monkeypatch.setattr(rank_faults, "_addresses", {r: s.getsockname() for r, s in socks.items()})
    monkeypatch.setattr(rank_faults, "_layout", RolloutLayout(4, 2))
    yield socks
    for s in socks.values():
        s.close()


def test_a_closed_port_is_a_dead_rank(beacons):
    assert rank_faults.dead_ranks() == []
    beacons[3].close()  # as the kernel does when the process dies
    assert rank_faults.dead_ranks() == [3]
    assert rank_faults.dead_ranks([1, 2]) == []


def test_the_verdict_names_the_dead_rank_with_the_failed_exchange(beacons):
    layout = RolloutLayout(4, 2)
    assert rank_faults.agree(layout, None) is None and rank_faults.agree(layout, None, probe=True) is None
    beacons[3].close()
    failure = RolloutRankLost("the rollout rank (rank 3) of this rollout_placement split run stopped answering while "
                              "waiting for a batch (Connection closed by peer)")
    verdict = rank_faults.agree(layout, failure)
    assert str(verdict) == str(failure) and verdict.on_every_trainer
    probed = rank_faults.agree(layout, None, probe=True)
    assert str(probed) == ("the rollout rank (rank 3) of this rollout_placement split run stopped answering (its port "
                           "no longer accepts connections)")
    with pytest.raises(RolloutRankLost, match=r"rollout rank \(rank 3\).*while waiting for a batch"):
        with rank_faults.lost_together(layout):
            raise failure


def test_a_dead_trainer_rank_is_named_after_a_failed_collective(beacons):
    assert rank_faults.lost_rank_error(RuntimeError("Connection reset by peer")) is None  # every rank answers
    beacons[1].close()
    lost = rank_faults.lost_rank_error(RuntimeError("[pair.cc:576] Read error: Connection reset by peer"))
    assert isinstance(lost, rank_faults.TrainerRankLost)
    assert str(lost) == ("the trainer rank (rank 1) of this rollout_placement split run stopped answering "
                         "([pair.cc:576] Read error: Connection reset by peer)")
    assert rank_faults.lost_rank_error(ValueError("not a collective")) is None
