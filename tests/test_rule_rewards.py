"""Several reward functions with weights: `WeightedScorer`, the server's
`--scorer a,b --weights` reply, and rule rewards in the trainer process (`use_rule_reward`)."""
import json

import numpy as np
import pytest

from ppo.scorers import ScorerError, WeightedScorer, parse_scorer_list
from tests.rule_reward_helpers import read_metrics, rule_argv  # also registers the test_rule_* scorers


def test_weighted_total_and_per_function_hand_computed():
    """reverse (1 when response == tgt) weight 1, length weight 0.5:
    item 0 'ab' vs 'ab' -> 1 + 0.5 * 2 = 2; item 1 'abc' vs 'ab' -> 0 + 0.5 * 3 = 1.5."""
    scorer = WeightedScorer("reverse,test_rule_len", "1,0.5")
    totals, parts = scorer.score_batch(["s", "s"], ["ab", "ab"], ["ab", "abc"])
    assert totals == [2.0, 1.5]
    assert parts == {"reverse": [1.0, 0.0], "test_rule_len": [2.0, 3.0]}
    assert WeightedScorer(["reverse"]).score_batch(["s"], ["a"], ["a"]) == ([1.0], {"reverse": [1.0]})


def test_parse_scorer_list_errors():
    assert parse_scorer_list("kk, math", "") == (["kk", "math"], [1.0, 1.0])
    with pytest.raises(ValueError, match="2 weights"):
        parse_scorer_list("kk", "1,2")
    with pytest.raises(ValueError, match="weight 'a' of scorer 'math'"):
        parse_scorer_list("kk,math", "1,a")
    with pytest.raises(ValueError, match="empty name"):
        parse_scorer_list("kk,,math")
    with pytest.raises(ValueError, match="twice"):
        parse_scorer_list("kk,kk")
    with pytest.raises(ValueError, match="unknown scorer 'nope'"):
        WeightedScorer("reverse,nope")


def test_scorer_failure_names_scorer_and_item_never_zero():
    scorer = WeightedScorer("reverse,test_rule_fails_on_x")
    with pytest.raises(ScorerError, match=r"scorer 'test_rule_fails_on_x' raised on item 1: RuntimeError: cannot score an x") as e:
        scorer.score_batch(["s", "s"], ["a", "b"], ["a", "x"])
    assert e.value.item == 1 and not e.value.bad_value
    with pytest.raises(ScorerError, match=r"scorer 'test_rule_nan' returned nan for item 0") as e:
        WeightedScorer("test_rule_nan").score_batch(["s"], ["a"], ["a"])
    assert e.value.bad_value


def test_server_answers_weighted_total_and_per_function_scores():
    from ppo.reward_server import ERR_SCORER_RAISED, create_app

    client = create_app("reverse,test_rule_len", weights="1,0.5").test_client()
    resp = client.post("/", data=json.dumps({"src": ["s", "s"], "tgt": ["ab", "ab"], "response": ["ab", "abc"]}))
    body = resp.get_json()
    assert resp.status_code == 200 and body["score"] == [2.0, 1.5]
    assert body["scores_per_function"] == {"reverse": [1.0, 0.0], "test_rule_len": [2.0, 3.0]}
    bad = create_app("test_rule_fails_on_x").test_client().post(
        "/", data=json.dumps({"src": ["s"], "tgt": ["a"], "response": ["x"]}))
    one = create_app("reverse").test_client().post("/", data=json.dumps({"src": ["s"], "tgt": ["a"], "response": ["a"]}))
    assert one.get_json() == {"error_code": 0, "error_msg": "Success", "score": [1.0]}  # PaddleNLP's reply exactly
    assert bad.status_code == 500 and bad.get_json()["error_code"] == ERR_SCORER_RAISED and "score" not in bad.get_json()
    assert "item 0" in bad.get_json()["error_msg"]
    with pytest.raises(ValueError, match="weights"):
        create_app("reverse,test_rule_len", weights="1")


def test_server_command_line_weights():
    from ppo.reward_server import parse_args

    args = parse_args(["--scorer", "kk,math", "--weights", "1,0.5"])
    assert (args.scorer, args.weights) == ("kk,math", "1,0.5")


def test_rule_reward_arguments():
    from ppo.entry.ppo_arguments import ModelArgument

    m = ModelArgument(actor_model_name_or_path="a", use_rule_reward=True, rule_reward_scorers="reverse,math",
                      rule_reward_weights="1,0.5")
    assert m.use_rule_reward
    with pytest.raises(ValueError, match="use_rm_server"):
        ModelArgument(actor_model_name_or_path="a", use_rule_reward=True, use_rm_server=True, rule_reward_scorers="reverse")
    # PaddleNLP's use_rule_reward alone scores GSM8K answers: the math scorer
    assert ModelArgument(actor_model_name_or_path="a", use_rule_reward=True).rule_reward_scorers == "math"
    with pytest.raises(ValueError, match="only used with use_rule_reward"):
        ModelArgument(actor_model_name_or_path="a", rule_reward_scorers="reverse")
    with pytest.raises(ValueError, match="1 weights"):
        ModelArgument(actor_model_name_or_path="a", use_rule_reward=True, rule_reward_scorers="reverse,math",
                      rule_reward_weights="1")


def test_trainer_scores_with_rules_in_process(tiny_model_dir, tiny_data_dir, tmp_path):
    """No server, no reward model: the trainer scores with reverse (w 1) + length (w 0.5);
    the logged samples' scores equal the weighted sum recomputed from their text."""
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "rule")
    trainer = build_trainer(rule_argv(tiny_model_dir, tiny_data_dir, out, "--rule_reward_scorers", "reverse,test_rule_len",
                                      "--rule_reward_weights", "1,0.5"))
    from ppo.trainer.scoring import RuleScorer

    assert trainer.passes.models.reward is None and trainer.passes.models.critic is None
    assert isinstance(trainer.experience.scoring.objectives[0].scorer, RuleScorer)
    trainer.train()
    (line,) = read_metrics(out)
    assert np.isfinite(line["loss/policy_avg"]) and "reward/test_rule_len" in line and "reward/reverse" in line
    samples = [json.loads(ln) for ln in open(f"{out}/samples.jsonl")]
    for s in samples:
        expected = 0.5 * len(s["response"])  # the random tiny model never reverses correctly
        assert abs(s["score"] - expected) < 1e-4 or abs(s["score"] - expected - 1.0) < 1e-4


def test_trainer_rule_failure_names_the_prompt(tiny_model_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "fail"), "--rule_reward_scorers",
                                      "test_rule_nan"))
    with pytest.raises(ScorerError, match=r"scorer 'test_rule_nan' returned nan for item 0; a score must be a finite number \(prompt 'Reverse"):
        trainer.train()
