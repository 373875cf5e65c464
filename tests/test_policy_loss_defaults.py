"""The policy losses' documented defaults: `gspo` and `gmpo` aggregate as their papers (and verl's
`compute_policy_loss_gspo` / `compute_policy_loss_geo_mean`) unless `loss_agg_mode` is set in the
argument file or on the command line, and the start-up line says which mode runs and why;
`top_entropy_frac` divides by the kept tokens (the Beyond-the-80/20 authors' code) unless
`top_entropy_norm all` (TRL) is chosen, and the trainer's step normaliser counts kept tokens."""
import json
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from ppo.entry import ppo_arguments
from ppo.algos import POLICY_LOSSES, entropy_bonus_from_token_entropy, get_policy_loss
from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.entry.policy_loss_arguments import policy_loss_startup_line
from ppo.trainer.settings import UpdateSettings, slice_of

PPO = (ppo_arguments.ModelArgument, ppo_arguments.DataArgument, ppo_arguments.PPOTrainingArguments)
PAPERS = {"gspo": "seq-mean-token-mean", "gmpo": "seq-mean-token-mean"}


def t(a):
    return paddle.to_tensor(np.asarray(a, dtype="float64"))


def batch(seed=0):
    """Rows of 1, 4 and 2 real tokens (unequal lengths: token-mean and seq-mean differ)."""
    rng = np.random.default_rng(seed)
    lp = rng.normal(scale=0.3, size=(3, 4)) - 1.0
    mask = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype="float64")
    adv = np.repeat(rng.normal(size=(3, 1)), 4, axis=1)
    return lp, lp + rng.normal(scale=0.2, size=lp.shape), adv, mask


def loss_of(name, mode=None, **kw):
    lp, old, adv, mask = batch()
    extra = {"uniforms": t(np.random.default_rng(1).random(mask.shape))} if POLICY_LOSSES[name].random else {}
    agg = {} if mode is None else {"loss_agg_mode": mode}
    return get_policy_loss(name)(t(lp), t(old), t(adv), t(mask), **agg, **extra, **kw)[0].numpy()


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_each_loss_defaults_to_its_papers_aggregation_and_honours_a_given_one(name):
    paper = PAPERS.get(name, "token-mean")
    assert POLICY_LOSSES[name].loss_agg_mode == paper
    assert loss_of(name).tobytes() == loss_of(name, paper).tobytes()
    other = "token-mean" if paper != "token-mean" else "seq-mean-token-mean"
    assert not np.allclose(loss_of(name, other), loss_of(name, paper))  # the choice matters on this batch
    mode, why = POLICY_LOSSES[name].aggregation(None)
    assert mode == paper and why.startswith(f"the default of policy_loss {name}: its paper's")
    assert POLICY_LOSSES[name].aggregation(other) == (other, "loss_agg_mode set in the arguments")


def test_gspo_default_is_the_mean_of_row_means_by_hand():
    """On-policy (ratio 1), advantages A_b on every token: GSPO's token loss is -A_b, so
    seq-mean-token-mean = -mean_b A_b over the 3 rows, token-mean = -(1 A_0 + 4 A_1 + 2 A_2) / 7."""
    lp, _, adv, mask = batch()
    loss = get_policy_loss("gspo")(t(lp), t(lp), t(adv), t(mask))[0].numpy()
    a = adv[:, 0]
    np.testing.assert_allclose(loss, -a.mean(), rtol=1e-12)
    token_mean = get_policy_loss("gspo")(t(lp), t(lp), t(adv), t(mask), loss_agg_mode="token-mean")[0].numpy()
    np.testing.assert_allclose(token_mean, -(a[0] + 4 * a[1] + 2 * a[2]) / 7, rtol=1e-12)


def parse(tmp_path, file_keys, *flags):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), **file_keys}))
    return parse_arguments(PPO, [str(path), *flags])[2]


@pytest.mark.parametrize("name", ["gspo", "gmpo"])
def test_start_up_line_names_the_mode_and_why(name, tmp_path):
    default = parse(tmp_path, {"policy_loss": name})
    assert default.loss_agg_mode is None
    assert policy_loss_startup_line(default).startswith(
        f"policy_loss {name}: loss_agg_mode seq-mean-token-mean (the default of policy_loss {name}: its paper's (Zh")
    assert policy_loss_startup_line(default).endswith("; value, entropy and KL terms: token-mean")
    for args in (parse(tmp_path, {"policy_loss": name, "loss_agg_mode": "token-mean"}),
                 parse(tmp_path, {"policy_loss": name}, "--loss_agg_mode", "token-mean")):
        assert args.loss_agg_mode == "token-mean"
        assert policy_loss_startup_line(args) == (f"policy_loss {name}: loss_agg_mode token-mean (loss_agg_mode set in "
                                                  "the arguments); value, entropy and KL terms: token-mean")
    ppo = parse(tmp_path, {}, "--top_entropy_frac", "0.2")
    assert policy_loss_startup_line(ppo).endswith(
        "; top_entropy_frac 0.2: divided by the kept tokens only (top_entropy_norm kept)")


def test_top_entropy_norm_is_refused_where_it_does_not_act(tmp_path):
    with pytest.raises(ArgumentError) as err:
        parse(tmp_path, {"top_entropy_norm": "all"})
    assert "top_entropy_norm='all' acts with top_entropy_frac < 1; top_entropy_frac is 1.0" in str(err.value)
    with pytest.raises(ArgumentError) as err:
        parse(tmp_path, {"top_entropy_frac": 0.2, "top_entropy_norm": "none"})
    assert "top_entropy_norm must be one of ('kept', 'all'), got 'none'" in str(err.value)
    assert parse(tmp_path, {"top_entropy_frac": 0.2, "top_entropy_norm": "all"}).top_entropy_norm == "all"


def updater(**given):
    from ppo.trainer.updater import PPOUpdater

    args = ppo_arguments.PPOTrainingArguments(output_dir="/tmp/unused_policy_loss_defaults", **given)
    ranks = SimpleNamespace(sum=lambda xs: list(xs), world_size=1)
    return PPOUpdater(None, [], None, None, ptx=None, divergence=None, offload=None, state=None, ranks=ranks,
                      settings=slice_of(UpdateSettings, args), samples=None)


def micro_batch():
    lp, old, adv, mask = batch()
    mb = SimpleNamespace(old_logprobs=t(old), advantages=t(adv), response_mask=t(mask), ref_logprobs=None,
                         rollout_is_weights=None)
    return mb, t(lp), t(np.random.default_rng(2).random(mask.shape)), mask


def test_trainer_runs_gspo_with_its_papers_mode_and_the_other_terms_token_mean():
    """policy_loss gspo, loss_agg_mode not set, entropy_coeff 0.1: the actor loss is GSPO's
    seq-mean-token-mean loss minus 0.1 x the token-mean entropy; set to token-mean, both are."""
    mb, lp, ent, mask = micro_batch()
    for given, policy_mode in ((None, "seq-mean-token-mean"), ("token-mean", "token-mean")):
        loss, _ = updater(policy_loss="gspo", entropy_coeff=0.1, loss_agg_mode=given).actor_loss(
            mb, {"logprobs": lp, "entropy": ent}, num_tokens=7.0, num_seqs=3.0)
        pg, _ = get_policy_loss("gspo")(lp, mb.old_logprobs, mb.advantages, mb.response_mask, loss_agg_mode=policy_mode,
                                        num_tokens=7.0, num_seqs=3.0)
        bonus, _ = entropy_bonus_from_token_entropy(ent, mb.response_mask, "token-mean", num_tokens=7.0)
        assert loss.numpy().tobytes() == (pg - 0.1 * bonus).numpy().tobytes(), given


def test_trainer_divides_the_kept_tokens_by_the_steps_kept_count():
    """top_entropy_frac 0.3 over micro-batches of 7 and 5 response tokens keeps ceil(2.1) = 3 and
    ceil(1.5) = 2: the step's normaliser is 5 (kept) instead of 12; `all` keeps none of it."""
    masks = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype="float64")
    plan = [[0, 1], [2, 3]]
    assert updater(top_entropy_frac=0.3).kept_token_count(plan, masks) == 5.0
    assert updater(top_entropy_frac=0.3, top_entropy_norm="all").kept_token_count(plan, masks) is None
    assert updater().kept_token_count(plan, masks) is None
    mb, lp, ent, mask = micro_batch()
    kept = updater(top_entropy_frac=0.5)
    loss, stats = kept.actor_loss(mb, {"logprobs": lp, "entropy": ent}, num_tokens=7.0, num_seqs=3.0, kept_tokens=4.0)
    ref, _ = get_policy_loss("ppo_clip")(lp, mb.old_logprobs, mb.advantages, mb.response_mask, entropy=ent,
                                         top_entropy_frac=0.5, num_tokens=4.0)
    every, _ = get_policy_loss("ppo_clip")(lp, mb.old_logprobs, mb.advantages, mb.response_mask, entropy=ent,
                                           top_entropy_frac=0.5, top_entropy_norm="all", num_tokens=7.0)
    assert loss.numpy().tobytes() == ref.numpy().tobytes()
    np.testing.assert_allclose(loss.numpy() * 4.0, every.numpy() * 7.0, rtol=1e-12)
    assert stats["policy/entropy_kept_frac"].numpy() == 4 / 7
