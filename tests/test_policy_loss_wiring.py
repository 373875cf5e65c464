"""The policy-loss registry's wiring into the arguments and the trainer, without training: every
registered setting is a real argument and a field of the updater's slice; unknown names and
settings nobody reads are refused before any model loads; the trainer's actor loss with
rollout-correction weights from equal log-probs is the on-policy loss, bit for bit."""
import ast
import os
from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from ppo.algos import ADV_ESTIMATORS, POLICY_LOSSES, get_policy_loss
from ppo.common.argument_problems import ArgumentError
from ppo.entry.ppo_arguments import PPOTrainingArguments
from ppo.trainer.settings import AdvantageSettings, UpdateSettings, slice_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGUMENT_FIELDS = PPOTrainingArguments.__dataclass_fields__


def ppo_args(**given):
    return PPOTrainingArguments(output_dir="/tmp/unused_policy_loss_wiring", **given)


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_every_policy_loss_setting_is_an_argument_with_the_entry_default(name):
    entry = POLICY_LOSSES[name]
    update_fields = {f.name for f in fields(UpdateSettings)}
    for setting, default in entry.settings.items():
        assert setting in ARGUMENT_FIELDS, f"{name}: setting {setting} is no argument"
        assert ARGUMENT_FIELDS[setting].default == default, f"{name}: {setting} defaults differ"
        assert setting in update_fields, f"{name}: setting {setting} is not in UpdateSettings"
    assert entry.settings_from(slice_of(UpdateSettings, ppo_args())) == entry.settings


@pytest.mark.parametrize("name", list(ADV_ESTIMATORS))
def test_every_estimator_setting_is_an_argument(name):
    for setting, default in ADV_ESTIMATORS[name].settings.items():
        assert setting in ARGUMENT_FIELDS and ARGUMENT_FIELDS[setting].default == default


def test_no_caller_branches_on_a_policy_loss_name():
    """Callers read an entry's facts: no comparison of `policy_loss` with a string in ppo/."""
    found = []
    for d, _, files in os.walk(os.path.join(ROOT, "ppo")):
        for f in (f for f in files if f.endswith(".py")):
            path = os.path.join(d, f)
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Compare):
                    names = [n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)
                             for n in [node.left, *node.comparators]]
                    if "policy_loss" in names and any(isinstance(n, ast.Constant) for n in node.comparators):
                        found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not found


def test_unknown_names_and_unread_settings_are_refused_together():
    with pytest.raises(ArgumentError) as err:
        ppo_args(policy_loss="ppo_clipp", rollout_is="tis", top_entropy_frac=0.0)
    text = str(err.value)
    assert "policy_loss must be one of ['ppo_clip', 'gspo', 'cispo', 'gmpo', 'clip_cov', 'kl_cov'], got 'ppo_clipp'" in text
    assert "rollout_is must be one of ('token', 'sequence', 'none'), got 'tis'" in text
    assert "top_entropy_frac must be in (0, 1]" in text


@pytest.mark.parametrize("given, message", [
    (dict(policy_loss="cispo", clip_range_ratio=0.3), "clip_range_ratio=0.3 is a setting of policy_loss ppo_clip / gspo / "
                                                      "clip_cov; policy_loss cispo does not read it"),
    (dict(gmpo_clip_high=0.2), "gmpo_clip_high=0.2 is a setting of policy_loss gmpo; policy_loss ppo_clip does not read it"),
    (dict(policy_loss="gspo", importance_sampling_level="sequence"), "importance_sampling_level='sequence' is a setting of "
                                                                     "policy_loss ppo_clip"),
    (dict(pass_k=2, adv_estimator="grpo", rollout_n=4), "pass_k=2 is a setting of adv_estimator pass_at_k"),
    (dict(adv_estimator="pass_at_k", rollout_n=4, pass_k=5), "pass_k must be in [1, rollout_n=4]"),
    (dict(rollout_is_lower=0.5), "rollout_is_lower=0.5 acts with rollout_is token or sequence; rollout_is is none"),
    (dict(rollout_is="token"), "set use_rollout_logprobs false"),
    (dict(rollout_is="sequence", use_rollout_logprobs=False, rollout_is_lower=2.0, rollout_is_upper=1.0),
     "rollout_is_lower (2.0) must be < rollout_is_upper (1.0)"),
])
def test_a_setting_nobody_reads_is_refused(given, message):
    with pytest.raises(ArgumentError, match=None) as err:
        ppo_args(**given)
    assert message in str(err.value)


def test_registered_settings_and_corrections_are_accepted():
    args = ppo_args(policy_loss="cispo", cispo_clip_high=2.0, rollout_is="token", use_rollout_logprobs=False,
                    rollout_is_threshold=1.5, rollout_is_lower=0.5, adv_estimator="pass_at_k", rollout_n=4, pass_k=2)
    assert get_policy_loss(args.policy_loss).settings_from(args) == {"cispo_clip_low": None, "cispo_clip_high": 2.0}
    s = slice_of(AdvantageSettings, args)
    assert (s.rollout_is, s.rollout_is_threshold, s.rollout_is_lower, s.rollout_is_upper) == ("token", 1.5, 0.5, None)


def updater_with(args):
    """A `PPOUpdater` with only what `actor_loss` reads (its slice of the arguments)."""
    from ppo.trainer.updater import PPOUpdater

    return PPOUpdater(None, [], None, None, ptx=None, divergence=None, offload=None, state=None, ranks=None,
                      settings=slice_of(UpdateSettings, args), samples=None)


def micro_batch(seed=0, n=3, t=5):
    rng = np.random.RandomState(seed)
    mask = (np.arange(t)[None, :] < rng.randint(1, t + 1, size=(n, 1))).astype("float32")
    f = lambda x: paddle.to_tensor(np.asarray(x, dtype="float32"))  # noqa: E731
    return SimpleNamespace(old_logprobs=f(-rng.rand(n, t) * 2), advantages=f(rng.randn(n, t)), response_mask=f(mask),
                           ref_logprobs=None, rollout_is_weights=None), f(-rng.rand(n, t) * 2), f(rng.rand(n, t) * 3)


@pytest.mark.parametrize("name", [n for n in POLICY_LOSSES if not POLICY_LOSSES[n].random])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_corrected_actor_loss_is_the_on_policy_loss_when_the_logprobs_agree(name, level):
    """AdvantageStage.correct_rollout with the engine's log-probs equal to the training forward's
    gives weights of exactly 1 (also through TIS and MIS bounds), and the trainer's actor loss
    with them is bit-equal to the loss without a correction, gradient included."""
    from ppo.trainer.advantages import AdvantageStage

    args = ppo_args(policy_loss=name, rollout_is=level, use_rollout_logprobs=False, rollout_is_threshold=1.5,
                    rollout_is_lower=0.5, rollout_is_upper=2.0, top_entropy_frac=0.6)
    mb, logprobs, entropy = micro_batch()
    exp = SimpleNamespace(old_logprobs=mb.old_logprobs, rollout_logprobs=mb.old_logprobs.clone(),
                          response_mask=mb.response_mask, rollout_is_weights=None)
    stage = SimpleNamespace(settings=slice_of(AdvantageSettings, args))
    stats = AdvantageStage.correct_rollout(stage, exp)
    assert float(stats["rollout/logprob_diff_max"]) == 0.0 and float(stats["rollout/is_masked_frac"]) == 0.0
    assert np.array_equal(exp.rollout_is_weights.numpy(), mb.response_mask.numpy())
    updater = updater_with(args)
    results = []
    for weights in (None, exp.rollout_is_weights):
        mb.rollout_is_weights = weights
        x = logprobs.clone()
        x.stop_gradient = False
        loss, _ = updater.actor_loss(mb, {"logprobs": x, "entropy": entropy}, num_tokens=7.0, num_seqs=3.0)
        loss.backward()
        results.append((loss.numpy(), x.grad.numpy()))
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])


def test_ppo_clip_actor_loss_is_ppo_policy_loss_bit_for_bit():
    """The default policy_loss gives today's numbers: the trainer's actor loss is `ppo_policy_loss`."""
    from ppo.algos import ppo_policy_loss

    args = ppo_args(clip_range_ratio_high=0.28, dual_clip=3.0)
    mb, logprobs, entropy = micro_batch(seed=1)
    loss, stats = updater_with(args).actor_loss(mb, {"logprobs": logprobs, "entropy": entropy}, 7.0, 3.0)
    ref, ref_stats = ppo_policy_loss(logprobs, mb.old_logprobs, mb.advantages, mb.response_mask, clip_range_ratio=0.2,
                                     clip_range_ratio_high=0.28, dual_clip=3.0, num_tokens=7.0, num_seqs=3.0)
    assert np.array_equal(loss.numpy(), ref.numpy())
    assert all(np.array_equal(np.asarray(stats[k]), np.asarray(v)) for k, v in ref_stats.items())
