"""A GRPO run whose every group has equal rewards for several steps in a row is warned about once."""
import json

from ppo.common.run_guard import FlatRewardWatch
from ppo.run_ppo import main as run_ppo
from ppo.scorers import register_scorer
from tests.rule_reward_helpers import rule_argv


@register_scorer("test_rule_constant")
def _constant_scorer(src, tgt, response):
    return 0.5


def test_watch_warns_once_after_patience_flat_steps():
    watch = FlatRewardWatch(patience=3)
    flat, mixed = {"grpo/frac_reward_zero_std": 1.0}, {"grpo/frac_reward_zero_std": 0.75}
    assert [watch.check(s, m) for s, m in [(1, flat), (2, flat), (3, mixed), (4, flat), (5, flat)]] == [None] * 5
    message = watch.check(6, flat)
    assert message.startswith("steps 4-6: every reward in every group was equal") and "GRPO advantage is zero" in message
    assert watch.check(7, flat) is None  # once
    assert FlatRewardWatch(patience=1).check(1, {"objective/scores": 1.0}) is None  # no groups: nothing to say


def test_grpo_run_with_a_constant_reward_is_warned_about(tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    out = str(tmp_path / "grpo")
    run_ppo(rule_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "3", "--rule_reward_scorers", "test_rule_constant"))
    assert "steps 1-3: every reward in every group was equal" in caplog.text
    rows = [json.loads(ln) for ln in open(f"{out}/metrics.jsonl")]
    assert [r["grpo/frac_reward_zero_std"] for r in rows if "grpo/frac_reward_zero_std" in r] == [1.0, 1.0, 1.0]
