"""rollout_update (csrc/cpu/step_update.cc: outputs, lengths, positions, stop flags, presence)
vs its pure-Paddle twin on random states: compacted rows, finished rows left untouched, stop
tokens, multi-token stop sequences, min_new_tokens gating, with and without the presence table."""
import numpy as np
import paddle
import pytest

from tests.rollout_ops_helpers import clone, custom_and_fallback_ops


@pytest.fixture(scope="module")
def rollout_ops():
    return custom_and_fallback_ops()


def _state(seed, B, B0, N, V, step):
    rng = np.random.default_rng(seed)
    rows = rng.permutation(B0)[:B].astype("int64")
    out_tokens = np.full((B0, N), 3, "int64")
    out_tokens[:, :step] = rng.integers(4, V, (B0, step))
    out_lp = np.zeros((B0, N), "float32")
    out_lp[:, :step] = -rng.random((B0, step))
    lengths = np.full(B0, step, "int64")
    tokens = rng.integers(0, V, B).astype("int64")
    tokens[0] = 2  # an EOS
    tokens[1] = 9  # completes the stop sequence [7, 8, 9] for rows[1]
    out_tokens[rows[1], step - 2 : step] = [7, 8]
    tokens[2] = 9  # 9 without [7, 8] before it: no stop
    out_tokens[rows[2], step - 2 : step] = [5, 8]
    fin = np.zeros(B, "int32")
    fin[[3, 5]] = 1
    tokens[5] = 3  # finished rows carry pad
    state = dict(
        tokens=tokens, logprobs=-rng.random(B).astype("float32"), rows=rows, finished=fin,
        pos=rng.integers(5, 20, B).astype("int64"), out_tokens=out_tokens, out_logprobs=out_lp, lengths=lengths,
        presence=(rng.random((B0, V)) < 0.2).astype("uint8"),
    )
    return {k: paddle.to_tensor(v) for k, v in state.items()}


@pytest.mark.parametrize("min_new,update_presence", [(0, True), (0, False), (100, True)])
def test_update_matches_fallback(rollout_ops, min_new, update_presence):
    custom, fb = rollout_ops
    B, B0, N, V, step = 9, 12, 10, 30, 6
    s = _state(11, B, B0, N, V, step)
    results = []
    for ops in (custom, fb):
        st = {k: clone(v) for k, v in s.items()}
        presence = st["presence"] if update_presence else paddle.zeros([1, 1], "uint8")
        n = ops.update(st["tokens"], st["logprobs"], st["rows"], st["finished"], st["pos"], st["out_tokens"],
                       st["out_logprobs"], st["lengths"], presence, step, min_new, [2, 17], [7, 8, 9, 11], [3, 1],
                       update_presence)
        results.append((int(n.item()), st))
    (n_c, c), (n_f, f) = results
    assert n_c == n_f
    for k in ("finished", "pos", "out_tokens", "out_logprobs", "lengths", "presence"):
        np.testing.assert_array_equal(c[k].numpy(), f[k].numpy(), err_msg=k)
    fin0, rows = s["finished"].numpy(), s["rows"].numpy()
    tok = s["tokens"].numpy()
    live = fin0 == 0
    # written where live, untouched where finished
    np.testing.assert_array_equal(c["out_tokens"].numpy()[rows[live], step], tok[live])
    np.testing.assert_array_equal(c["out_tokens"].numpy()[rows[~live]], s["out_tokens"].numpy()[rows[~live]])
    np.testing.assert_array_equal(c["lengths"].numpy()[rows[live]], step + 1)
    np.testing.assert_array_equal(c["pos"].numpy(), s["pos"].numpy() + live)
    fin = c["finished"].numpy()
    expect_stop = live & (np.isin(tok, [2, 17]) | np.isin(np.arange(B), [1]) | (tok == 11))
    if min_new > step + 1:
        expect_stop[:] = False
    np.testing.assert_array_equal(fin, np.where(expect_stop, 1, fin0))
    assert n_c == int((fin == 0).sum())
    if update_presence:
        assert np.all(c["presence"].numpy()[rows[live], tok[live]] == 1)
