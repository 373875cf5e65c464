"""The policy-loss registry (ppo.algos.policy_registry): `ppo_clip` and `gspo` bit-identical to
`ppo_policy_loss`, CISPO and GMPO by hand per regime and against their reference code, and for
every entry: one signature, its facts, loop versus vectorised, garbage at masked positions,
no mutation, token selection by entropy, float32, the generated table."""
import inspect
import itertools
import math

import numpy as np
import paddle
import pytest

from ppo.algos import LOSS_AGG_MODES, POLICY_LOSSES, get_policy_loss, ppo_policy_loss
from scripts.gen_policy_loss_table import main as gen_policy_loss_table


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def leaf(a, dtype="float64"):
    x = t(a, dtype)
    x.stop_gradient = False
    return x


def random_batch(seed, B=5, T=9, scale=0.4):
    """log-probs, old log-probs, advantages, a mask with holes and an empty row, entropies."""
    rng = np.random.default_rng(seed)
    lp = rng.normal(scale=0.5, size=(B, T)) - 1.0
    old = lp + rng.normal(scale=scale, size=(B, T))
    adv = rng.normal(size=(B, T))
    mask = (rng.random((B, T)) > 0.3).astype("float64")
    mask[0] = 0
    mask[1, 0] = 1
    ent = rng.random((B, T)) * 2
    return lp, old, adv, mask, ent


def run(name, lp, old, adv, mask, dtype="float64", **kw):
    """(loss, d loss / d logp, stats as numpy) of registry entry `name`."""
    x = leaf(lp, dtype)
    loss, stats = get_policy_loss(name)(x, t(old, dtype), t(adv, dtype), t(mask, dtype), **kw)
    loss.backward()
    return loss.numpy(), x.grad.numpy(), {k: v.numpy() for k, v in stats.items()}


# ------------------------------------------------------------------ today's numbers, to the bit

PPO_CONFIGS = list(itertools.product(
    ["float32", "float64"], LOSS_AGG_MODES, [None, 3.0], [(None, None), (0.1, 0.28)], ["token", "sequence"]))


@pytest.mark.parametrize("dtype,mode,dual,bounds,level", PPO_CONFIGS)
def test_ppo_clip_and_gspo_are_bit_identical_to_ppo_policy_loss(dtype, mode, dual, bounds, level):
    """`ppo_clip` (and `gspo` for the sequence level) give ppo_policy_loss's loss, gradient and
    stats bit for bit, on random inputs, in every aggregation mode."""
    lp, old, adv, mask, _ = random_batch(1)
    settings = dict(clip_range_ratio=0.2, clip_range_ratio_low=bounds[0], clip_range_ratio_high=bounds[1], dual_clip=dual)
    agg = dict(loss_agg_mode=mode, loss_scale_factor=9, num_tokens=31 if mode == "token-mean" else None)
    x = leaf(lp, dtype)
    want, want_stats = ppo_policy_loss(x, t(old, dtype), t(adv, dtype), t(mask, dtype), importance_sampling_level=level,
                                       **settings, **agg)
    want.backward()
    names = [("ppo_clip", {"importance_sampling_level": level})] + ([("gspo", {})] if level == "sequence" else [])
    for name, extra in names:
        loss, grad, stats = run(name, lp, old, adv, mask, dtype, **settings, **extra, **agg)
        assert loss.tobytes() == want.numpy().tobytes(), name
        assert grad.tobytes() == x.grad.numpy().tobytes(), name
        assert stats.keys() == want_stats.keys()
        for k in stats:
            assert stats[k].tobytes() == want_stats[k].numpy().tobytes(), (name, k)


def verl_reference(x, old, adv, mask, level, dual_clip, low=0.1, high=0.28):
    """verl's compute_policy_loss_vanilla (core_algos.py:1159-1250: clamped log-ratio, max of the
    clipped and unclipped terms, the dual clip min(., -c A) for A < 0, token-mean) and
    compute_policy_loss_gspo (core_algos.py:1253-1326: log s = logp - sg(logp) + sg(mean_t d),
    clamped at 10, seq-mean-token-mean), in paddle from their description, for the gradient."""
    m, a = t(mask), t(adv)
    d = x - t(old)
    if level == "sequence":
        seq = ((d * m).sum(-1) / m.sum(-1).clip(min=1)).detach().unsqueeze(-1)
        ratio = paddle.exp(paddle.clip(x - x.detach() + seq, max=10.0))
    else:
        ratio = paddle.exp(paddle.clip(d, -20.0, 20.0))
    loss = paddle.maximum(-a * ratio, -a * paddle.clip(ratio, 1 - low, 1 + high))
    if dual_clip is not None:
        loss = paddle.where(a < 0, paddle.minimum(loss, -a * dual_clip), loss)
    if level == "sequence":
        rows = m.sum(-1) > 0
        per_row = (loss * m).sum(-1) / (m.sum(-1) + 1e-8)
        return (per_row * rows.astype("float64")).sum() / rows.astype("float64").sum()
    return (loss * m).sum() / m.sum()


@pytest.mark.parametrize("name,level,dual", [("ppo_clip", "token", None), ("ppo_clip", "token", 3.0), ("gspo", "sequence", None)])
def test_ppo_clip_and_gspo_match_verl(name, level, dual):
    lp, old, adv, mask, _ = random_batch(12, scale=0.3)
    x = leaf(lp)
    want = verl_reference(x, old, adv, mask, level, dual)
    want.backward()
    agg = "seq-mean-token-mean" if level == "sequence" else "token-mean"
    loss, grad, _ = run(name, lp, old, adv, mask, loss_agg_mode=agg, dual_clip=dual, clip_range_ratio_low=0.1,
                        clip_range_ratio_high=0.28)
    rtol = 1e-7 if level == "sequence" else 1e-12  # verl divides rows by n_b + 1e-8, we by n_b
    np.testing.assert_allclose(loss, want.numpy(), rtol=rtol)
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=rtol, atol=1e-15)


# ------------------------------------------------------------------ facts and the signature

def test_facts_match_the_functions():
    """Every setting is a keyword of the entry's function with the same default; facts are sane."""
    for e in POLICY_LOSSES.values():
        params = inspect.signature(e.fn).parameters
        for name, default in e.settings.items():
            if e.name == "gspo":  # _gspo forwards **settings to ppo_clip_token_losses
                params = inspect.signature(POLICY_LOSSES["ppo_clip"].fn).parameters
            assert params[name].default == default, (e.name, name)
        assert e.needs_old_logprobs and e.loss_agg_mode in LOSS_AGG_MODES and e.source and e.compared
        assert ("uniforms" in params) == e.random, e.name
    assert [e.name for e in POLICY_LOSSES.values() if e.sequence_level] == ["gspo", "gmpo"]
    with pytest.raises(ValueError, match="valid choices"):
        get_policy_loss("grpo")


def test_unknown_setting_and_stray_uniforms_are_refused():
    lp, old, adv, mask, _ = random_batch(2)
    with pytest.raises(ValueError, match="takes no"):
        run("cispo", lp, old, adv, mask, clip_range_ratio=0.2)
    with pytest.raises(ValueError, match="draws no random"):
        run("kl_cov", lp, old, adv, mask, uniforms=t(np.zeros_like(lp)))
    with pytest.raises(ValueError, match="entropy"):
        run("ppo_clip", lp, old, adv, mask, top_entropy_frac=0.5)


def test_settings_from_reads_exactly_the_entry_settings():
    class Args:
        clip_range_ratio, clip_range_ratio_low, clip_range_ratio_high, dual_clip = 0.3, None, 0.4, None
        cispo_clip_low, cispo_clip_high, unrelated = 0.5, 2.0, 7

    assert get_policy_loss("cispo").settings_from(Args) == {"cispo_clip_low": 0.5, "cispo_clip_high": 2.0}
    assert get_policy_loss("gspo").settings_from(Args) == {
        "clip_range_ratio": 0.3, "clip_range_ratio_low": None, "clip_range_ratio_high": 0.4, "dual_clip": None}


def test_table_in_docs_is_current():
    assert gen_policy_loss_table(["--check"]) == 0, "run: python scripts/gen_policy_loss_table.py"


# ------------------------------------------------------------------ CISPO

# (id, r, A, clip_low, clip_high, w, clipfrac): L = -w A log r, dL/dlogp = -w A
CISPO_REGIMES = [
    ("inside", 1.5, 2.0, None, 4.0, 1.5, 0.0),        # 1.5 < 5: w = r
    ("capped_high", 8.0, 2.0, None, 4.0, 5.0, 1.0),   # 8 > 1 + 4: w = 5
    ("floored_low", 0.5, 2.0, 0.2, 4.0, 0.8, 1.0),    # 0.5 < 1 - 0.2: w = 0.8
    ("no_lower_bound", 0.5, 2.0, None, 4.0, 0.5, 0.0),  # the paper's setting: nothing below
    ("negative_adv_uncapped", 8.0, -1.0, None, None, 8.0, 0.0),  # no bounds at all: w = r
]


@pytest.mark.parametrize("case", CISPO_REGIMES, ids=[c[0] for c in CISPO_REGIMES])
def test_cispo_regimes(case):
    """One token, old = 0, logp = log r: L = -w A log r and dL/dlogp = -w A, never 0 (the
    weight is a constant; unlike PPO's clip every token keeps its gradient)."""
    _, r, a, low, high, w, cf = case
    loss, grad, stats = run("cispo", [[math.log(r)]], [[0.0]], [[a]], [[1]], cispo_clip_low=low, cispo_clip_high=high)
    np.testing.assert_allclose(loss, -w * a * math.log(r), rtol=1e-12)
    np.testing.assert_allclose(grad, [[-w * a]], rtol=1e-12)
    assert stats["policy/clipfrac_avg"] == cf
    np.testing.assert_allclose(stats["val/ratio"], r, rtol=1e-12)


def cispo_reference(lp, old, adv, mask, low, high):
    """CISPO as verl's compute_policy_loss_cispo (core_algos.py:1721-1779) computes it: weight
    clamp(exp(logp - old), lower, upper), detached; loss -w A logp; token-mean over the mask.
    TRL's loss_type "cispo" (grpo_trainer.py:3080-3082) is the case lower = None, upper = its
    epsilon_high. Written here from their description; numpy, float64."""
    w = np.exp(np.clip(lp - old, -20, 20))
    w = np.clip(w, -np.inf if low is None else 1 - low, np.inf if high is None else 1 + high)
    tok = -w * adv * lp
    return (tok * mask).sum() / mask.sum(), -(w * adv * mask) / mask.sum()


@pytest.mark.parametrize("low,high", [(0.2, 0.28), (None, 4.0), (None, 0.1)])
def test_cispo_matches_verl_and_trl(low, high):
    lp, old, adv, mask, _ = random_batch(3, scale=0.3)
    want, want_grad = cispo_reference(lp, old, adv, mask, low, high)
    loss, grad, _ = run("cispo", lp, old, adv, mask, cispo_clip_low=low, cispo_clip_high=high)
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)


def test_cispo_on_policy_gradient_equals_ppo():
    """With logp = old every ratio is 1: CISPO's gradient -A d logp equals PPO-clip's -A r d logp."""
    lp, _, adv, mask, _ = random_batch(4)
    _, g_cispo, _ = run("cispo", lp, lp, adv, mask)
    _, g_ppo, _ = run("ppo_clip", lp, lp, adv, mask)
    np.testing.assert_allclose(g_cispo, g_ppo, rtol=1e-14)


# ------------------------------------------------------------------ GMPO

# (id, d = logp - old, A, loss, dL/dlogp, clipfrac), bounds 0.4 in log space
GMPO_REGIMES = [
    ("inside", 0.2, 1.0, -math.exp(0.2), -math.exp(0.2), 0.0),
    ("held_high_positive_adv", 0.6, 1.0, -math.exp(0.4), 0.0, 1.0),
    ("low_not_held_positive_adv", -0.6, 1.0, -math.exp(-0.6), -math.exp(-0.6), 0.0),
    ("held_low_negative_adv", -0.6, -1.0, math.exp(-0.4), 0.0, 1.0),
    ("high_not_held_negative_adv", 0.6, -1.0, math.exp(0.6), math.exp(0.6), 0.0),
    ("zero_adv", 0.6, 0.0, 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize("case", GMPO_REGIMES, ids=[c[0] for c in GMPO_REGIMES])
def test_gmpo_regimes(case):
    """One token: s = exp(d') with d' = min(d, clip(d, -0.4, 0.4)) for A > 0, max(...) for A < 0;
    loss -A s; gradient -A s where d' = d, 0 where d is held at a bound."""
    _, d, a, want, want_grad, cf = case
    loss, grad, stats = run("gmpo", [[d - 1.0]], [[-1.0]], [[a]], [[1]])
    np.testing.assert_allclose(loss, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(grad, [[want_grad]], rtol=1e-12, atol=1e-15)
    assert stats["policy/clipfrac_avg"] == cf


def test_gmpo_two_tokens_geometric_mean():
    """d = (0.2, 0.6), A = 1: d' = (0.2, 0.4), s = exp(0.3); seq-mean-token-mean loss -e^0.3;
    gradient -s / 2 on the free token, 0 on the held one (d s / d logp_t = s / |o| [t free])."""
    loss, grad, stats = run("gmpo", [[0.2, 0.6, 9.0]], [[0.0, 0.0, -9.0]], [[1.0, 1.0, 5.0]], [[1, 1, 0]],
                            loss_agg_mode="seq-mean-token-mean")
    s = math.exp(0.3)
    np.testing.assert_allclose(loss, -s, rtol=1e-12)
    np.testing.assert_allclose(grad, [[-s / 2, 0.0, 0.0]], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(stats["val/ratio"], s, rtol=1e-12)
    assert stats["policy/clipfrac_avg"] == 0.5


def gmpo_reference(x, old, adv, mask, low=0.4, high=0.4):
    """GMPO as the authors' train_zero_math_gmpo.py:675-688 (callsys/GMPO) and verl's
    compute_policy_loss_geo_mean (core_algos.py:1635-1718) compute it, sequence by sequence:
    A_b = row mean of the advantages, d' = min(d, clip(d)) (A > 0) / max(d, clip(d)) (A < 0),
    s_b = exp(mean_t d'), loss = mean over rows of -A_b s_b. Paddle, so autograd gives the
    gradient of the sequence-level formula itself (no token form)."""
    m = t(mask)
    a = (t(adv) * m).sum(-1) / m.sum(-1)
    d = x - t(old)
    held = paddle.clip(d, -low, high)
    d_eff = paddle.where(a.unsqueeze(-1) > 0, paddle.minimum(d, held), paddle.maximum(d, held))
    s = paddle.exp((d_eff * m).sum(-1) / m.sum(-1))
    return paddle.mean(-a * s)


def test_gmpo_matches_authors_and_verl_loss_and_gradient():
    lp, old, adv, mask, _ = random_batch(5, scale=0.5)
    lp, old, adv, mask = lp[1:], old[1:], adv[1:], mask[1:]  # the references average over every row
    x = leaf(lp)
    want = gmpo_reference(x, old, adv, mask)
    want.backward()
    loss, grad, _ = run("gmpo", lp, old, adv, mask, loss_agg_mode="seq-mean-token-mean")
    np.testing.assert_allclose(loss, want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-10, atol=1e-15)


# ------------------------------------------------------------------ every entry

def token_loss_loop(name, lp, old, adv, mask):
    """Per-token losses of `name` by a plain loop over rows and tokens (numpy, float64)."""
    B, T = lp.shape
    out = np.zeros((B, T))
    for b in range(B):
        idx = [j for j in range(T) if mask[b, j]]
        for j in idx:
            d = float(np.clip(lp[b, j] - old[b, j], -20, 20))
            r = math.exp(d)
            if name == "ppo_clip":
                out[b, j] = max(-adv[b, j] * r, -adv[b, j] * min(max(r, 0.8), 1.2))
            elif name == "cispo":
                out[b, j] = -min(r, 5.0) * adv[b, j] * lp[b, j]
        if name == "gmpo" and idx:
            a = sum(adv[b, j] for j in idx) / len(idx)
            held = [min(lp[b, j] - old[b, j], 0.4) if a > 0 else max(lp[b, j] - old[b, j], -0.4) for j in idx]
            s = math.exp(sum(held) / len(held)) if a != 0 else 1.0
            for j in idx:
                out[b, j] = -a * s
    return out


@pytest.mark.parametrize("name", ["ppo_clip", "cispo", "gmpo"])
def test_loop_versus_vectorised(name):
    lp, old, adv, mask, _ = random_batch(6)
    tok = token_loss_loop(name, lp, old, adv, mask)
    loss, _, _ = run(name, lp, old, adv, mask, loss_agg_mode="seq-mean-token-sum")
    rows = mask.sum(-1) > 0
    np.testing.assert_allclose(loss, tok.sum(-1)[rows].mean(), rtol=1e-12)


def entry_kwargs(name, mask):
    return {"uniforms": t(np.random.default_rng(7).random(mask.shape))} if POLICY_LOSSES[name].random else {}


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_garbage_at_masked_positions_and_no_mutation(name):
    """Huge values at masked positions (log-probs, old log-probs, advantages, entropies, IS
    weights) change neither the loss, the stats nor the gradient at real tokens (0 at the
    others); inputs are not written into."""
    lp, old, adv, mask, ent = random_batch(8)
    w = np.random.default_rng(9).random(lp.shape) + 0.5
    opts = dict(top_entropy_frac=0.6, loss_agg_mode="seq-mean-token-mean", **entry_kwargs(name, mask))
    tensors = [t(lp), t(old), t(adv), t(mask), t(ent), t(w)]
    copies = [x.numpy().copy() for x in tensors]
    get_policy_loss(name)(*tensors[:4], entropy=tensors[4], rollout_is_weights=tensors[5], **opts)
    for x, c in zip(tensors, copies):
        np.testing.assert_array_equal(x.numpy(), c)
    g = lambda x, v: np.where(mask == 1, x, v)  # noqa: E731
    loss, grad, stats = run(name, lp, old, adv, mask, entropy=t(ent), rollout_is_weights=t(w), **opts)
    loss_g, grad_g, stats_g = run(name, g(lp, 1e3), g(old, -1e3), g(adv, 1e6), mask, entropy=t(g(ent, 1e9)),
                                  rollout_is_weights=t(g(w, 1e9)), **opts)
    assert loss_g.tobytes() == loss.tobytes()
    np.testing.assert_array_equal(grad_g, grad)
    assert not grad[mask == 0].any()
    for k in stats:
        assert stats_g[k].tobytes() == stats[k].tobytes(), k


@pytest.mark.parametrize("norm", ["kept", "all"])
@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_entropy_selection_keeps_top_tokens_and_the_normaliser(name, norm):
    """top_entropy_frac = 0.25 keeps the k = ceil(0.25 N) highest-entropy real tokens. token-mean:
    `kept` (the default, the Beyond-80/20 authors' agg_loss over response_mask * entropy_top_mask)
    divides the kept tokens' losses by k, `all` (TRL) by all N real tokens; dropped tokens get no
    gradient either way."""
    lp, old, adv, mask, ent = random_batch(10)
    kw = entry_kwargs(name, mask)
    N = int(mask.sum())
    k = math.ceil(0.25 * N)
    order = sorted(np.flatnonzero(mask.reshape(-1)), key=lambda i: -ent.reshape(-1)[i])
    kept = np.zeros(mask.size)
    kept[order[:k]] = 1
    kept = kept.reshape(mask.shape)
    full, _, _ = run(name, lp, old, adv, kept, loss_agg_mode="token-mean", num_tokens=k if norm == "kept" else N, **kw)
    opts = dict(entropy=t(ent), top_entropy_frac=0.25, loss_agg_mode="token-mean")
    loss, grad, stats = run(name, lp, old, adv, mask, **opts, **({} if norm == "kept" else {"top_entropy_norm": norm}), **kw)
    assert stats["policy/entropy_kept_frac"] == k / N
    assert not grad[(mask == 1) & (kept == 0)].any()
    if name in ("gspo", "gmpo", "clip_cov", "kl_cov"):  # these read every real token (row ratio, covariance)
        loss_all, _, _ = run(name, lp, old, adv, mask, **opts, top_entropy_norm="all", **kw)
        np.testing.assert_allclose(loss_all * N / k if norm == "kept" else loss_all, loss, rtol=1e-12)
        return
    np.testing.assert_allclose(loss, full, rtol=1e-12)


def test_entropy_selection_normaliser_by_hand():
    """One row, cispo-free check with ppo_clip on-policy (r = 1, token loss -A): A = [-1, -2, -3, -4],
    entropies [0.1, 0.2, 0.9, 0.8], top_entropy_frac 0.5 keeps tokens 2 and 3 (losses 3, 4):
    kept -> (3 + 4) / 2 = 3.5, all -> (3 + 4) / 4 = 1.75; seq-mean-token-mean alike (one row)."""
    lp = [[-1.0, -1.0, -1.0, -1.0]]
    adv, ent, mask = [[-1.0, -2.0, -3.0, -4.0]], [[0.1, 0.2, 0.9, 0.8]], [[1.0, 1.0, 1.0, 1.0]]
    for mode in ("token-mean", "seq-mean-token-mean"):
        kept, _, _ = run("ppo_clip", lp, lp, adv, mask, entropy=t(ent), top_entropy_frac=0.5, loss_agg_mode=mode)
        every, _, _ = run("ppo_clip", lp, lp, adv, mask, entropy=t(ent), top_entropy_frac=0.5, loss_agg_mode=mode,
                          top_entropy_norm="all")
        assert float(kept) == 3.5 and float(every) == 1.75, mode
    with pytest.raises(ValueError, match="top_entropy_norm"):
        run("ppo_clip", lp, lp, adv, mask, entropy=t(ent), top_entropy_frac=0.5, top_entropy_norm="none")


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_float32_keeps_dtype_and_is_finite(name):
    lp, old, adv, mask, ent = random_batch(11)
    w = t(np.ones_like(lp), "float32")
    loss, grad, stats = run(name, lp, old, adv, mask, "float32", entropy=t(ent, "float32"), top_entropy_frac=0.5,
                            rollout_is_weights=w, **entry_kwargs(name, mask))
    assert loss.dtype == np.float32 and grad.dtype == np.float32
    assert np.isfinite(loss) and np.isfinite(grad).all() and all(np.isfinite(v) for v in stats.values())
