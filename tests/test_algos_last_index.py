"""ppo.algos.last_nonzero_index: the one pure "last real token" helper (the model side's
`last_token_index`, `last_token_mask` and the token-wise RM loss use it)."""
import numpy as np
import paddle

from ppo.algos import last_nonzero_index, last_token_mask


def test_hand_computed_layouts():
    """Right padding -> last 1 at 2; left padding -> T-1 = 4; holes -> the last 1 (3);
    empty row -> -1; float weights count as non-zero."""
    mask = paddle.to_tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 1, 0, 1, 0], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(last_nonzero_index(mask).numpy(), [2, 4, 3, -1])
    np.testing.assert_array_equal(last_nonzero_index(paddle.to_tensor([[0.5, 0.0, 0.25]])).numpy(), [2])
    np.testing.assert_array_equal(last_token_mask(mask).numpy().astype(int)[:, :].sum(-1), [1, 1, 1, 0])


def test_loop_matches_vectorised_and_no_mutation():
    rng = np.random.default_rng(0)
    m = (rng.random((6, 9)) > 0.6).astype("int64")
    t = paddle.to_tensor(m)
    got = last_nonzero_index(t).numpy()
    for i in range(6):
        nz = np.nonzero(m[i])[0]
        assert got[i] == (nz[-1] if len(nz) else -1)
    np.testing.assert_array_equal(t.numpy(), m)
