"""Online DPO with a generative judge (dpo/pair_choice.py, dpo/online_pairs.build_judged_pairs):
pairs chosen by the judge's pairwise verdicts on hand-worked cases, the comparisons asked, a
self-rewarding run (`judge_model policy`) end to end, and judge arguments refused before any
model loads."""
import json

import numpy as np
import pytest

from dpo.online_pairs import build_judged_pairs
from dpo.pair_choice import preference_matrix
from dpo.run_online_dpo import build_trainer, main
from ppo.algos.judge_scores import order_averaged_preference
from tests.test_online_dpo import online_argv, read_jsonl


def prefs_of(upper):
    """`[G, k, k]` from each group's `{(i, j): P[i, j]}` for i < j (`P[j, i] = 1 - P[i, j]`)."""
    k = 1 + max(j for group in upper for _, j in group)
    out = np.full([len(upper), k, k], 0.5)
    for g, group in enumerate(upper):
        for (i, j), p in group.items():
            out[g, i, j], out[g, j, i] = p, 1 - p
    return out


def test_best_worst_by_mean_win_probability_then_the_direct_verdict():
    # group 0: wins a0 = (0.8 + 0.3) / 2 = 0.55, a1 = (0.2 + 0.1) / 2 = 0.15, a2 = (0.7 + 0.9) / 2 = 0.8:
    # best 2, worst 1, P[2, 1] = 0.9 -> chosen row 2, rejected row 1. Group 1 (rows 3-5): all 1/2, tied.
    prefs = prefs_of([{(0, 1): 0.8, (0, 2): 0.3, (1, 2): 0.1}, {(0, 1): 0.5, (0, 2): 0.5, (1, 2): 0.5}])
    pairs = build_judged_pairs(prefs)
    assert pairs.chosen.tolist() == [2] and pairs.rejected.tolist() == [1]
    assert pairs.num_groups == 2 and pairs.tied_groups == 1
    # the gap of the kept pair is 2 * 0.9 - 1 = 0.8: a margin of 0.85 drops it, 0.75 keeps it
    assert len(build_judged_pairs(prefs, margin=0.85)) == 0 and len(build_judged_pairs(prefs, margin=0.75)) == 1


def test_best_worst_follows_the_judges_own_verdict_on_an_intransitive_group():
    # wins a0 = (0.4 + 1.0) / 2 = 0.7, a1 = (0.6 + 0.0) / 2 = 0.3, a2 = (0.0 + 1.0) / 2 = 0.5: the Borda best is 0 and
    # the worst 1, but asked directly the judge prefers 1 over 0 (P[0, 1] = 0.4): chosen 1, rejected 0
    pairs = build_judged_pairs(prefs_of([{(0, 1): 0.4, (0, 2): 1.0, (1, 2): 0.0}]))
    assert pairs.chosen.tolist() == [1] and pairs.rejected.tolist() == [0] and pairs.tied_groups == 0


def test_all_pairs_keeps_verdict_gaps_above_the_margin_and_drops_duplicate_answers():
    prefs = prefs_of([{(0, 1): 0.8, (0, 2): 0.3, (1, 2): 0.1}])  # gaps: 0 > 1 by 0.6, 2 > 0 by 0.4, 2 > 1 by 0.8
    pairs = build_judged_pairs(prefs, "all_pairs", margin=0.5)
    assert pairs.chosen.tolist() == [0, 2] and pairs.rejected.tolist() == [1, 1]
    same = prefs_of([{(0, 1): 0.5, (0, 2): 0.9, (1, 2): 0.9}])  # answers 0 and 1 are one answer
    deduped = build_judged_pairs(same, "all_pairs", answer_keys=["x", "x", "y"])
    assert deduped.chosen.tolist() == [0] and deduped.rejected.tolist() == [2] and deduped.duplicate_pairs == 1


def test_judged_pairs_refuse_bad_shapes_and_non_finite_verdicts():
    with pytest.raises(ValueError, match="groups, k, k"):
        build_judged_pairs(np.full([2, 3], 0.5))
    with pytest.raises(ValueError, match="finite"):
        build_judged_pairs(np.full([1, 2, 2], np.nan))


def test_the_matrix_asks_each_distinct_pair_once_and_both_orders_cancel_position_bias():
    """A judge that likes longer answers and, asked in one order, adds 0.3 for the first position:
    order averaging (`GenerativeJudge.compare`) leaves its length preference alone."""
    asked = []

    def p_first(a, b):  # P("A") with a shown first
        return min(1.0, 0.5 + 0.1 * (len(a) - len(b)) + 0.3)

    def compare(questions, answers_a, answers_b, references):
        asked.extend(zip(answers_a, answers_b))
        first = np.array([p_first(a, b) for a, b in zip(answers_a, answers_b)])
        swapped = np.array([p_first(b, a) for a, b in zip(answers_a, answers_b)])
        return ((first + 1 - swapped) / 2).tolist()

    answers = ["abc", "a", "abc", "ab"]  # one group of 4; rows 0 and 2 are the same answer
    prefs, n = preference_matrix(compare, ["q"] * 4, answers, [None] * 4, 4, answers)
    assert n == 5 and ("abc", "abc") not in asked  # 6 pairs less the identical one
    assert prefs[0, 0, 1] == pytest.approx(0.7) and prefs[0, 1, 0] == pytest.approx(0.3)  # 0.5 + 0.1 * 2, bias gone
    assert prefs[0, 0, 2] == 0.5 and prefs[0, 3, 1] == pytest.approx(0.6)
    pairs = build_judged_pairs(prefs)
    assert pairs.chosen.tolist() == [0] and pairs.rejected.tolist() == [1]  # the longest (first of equals) vs the shortest
    np.testing.assert_allclose(order_averaged_preference(np.array([0.8]), np.array([0.8])), [0.5])


def test_self_rewarding_run_judges_its_own_pairs(tiny_model_dir, tiny_data_dir, tmp_path):
    """`judge_model policy` with no other score source: the round's scores are the policy's own
    pointwise verdicts, the pairs its pairwise verdicts; every metric is finite and every kept
    pair's chosen answer is the one the judge prefers."""
    out = str(tmp_path / "self")
    argv = online_argv(tiny_model_dir, tiny_data_dir, out, "--use_rule_reward", "false", "--rule_reward_scorers=",
                       "--judge_model", "policy", "--judge_template", "tiny", "--judge_pair_template", "tiny_better",
                       "--max_steps", "2", "--eval_steps", "0", "--do_eval", "false")
    summary = main(argv)
    rows = [r for r in read_jsonl(f"{out}/metrics.jsonl") if "objective/scores" in r]
    assert [r["step"] for r in rows] == [1, 2] and summary["steps"] == 2
    for r in rows:
        assert 0.0 < r["objective/scores"] < 1.0  # P(Yes) / (P(Yes) + P(No)) of the policy's own answers
        assert r["online_dpo/judge_comparisons"] > 0 and r["online_dpo/num_pairs"] >= 1
        assert 0.5 < r["online_dpo/judge_preference"] <= 1.0  # the chosen answer is the judge's pick
        assert np.isfinite([r["loss/dpo"], r["loss/sft"], r["rewards/margins"], r["loss/total"]]).all()
    resolved = json.load(open(f"{out}/resolved_arguments.json"))
    assert resolved["ModelArgument"]["judge_model"] == "policy"


def test_a_judged_round_pairs_what_the_live_policy_prefers(tiny_model_dir, tiny_data_dir, tmp_path):
    """A rule reward scores the round, the policy as judge picks the pairs: each pair's chosen
    answer is the one the policy's `compare` prefers, asked afresh."""
    from ppo.evaluation import decode_responses

    trainer = build_trainer(online_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "judged"), "--judge_model", "policy",
                                        "--judge_pair_template", "tiny_better"))
    learner = trainer.learner
    exp = trainer.experience.scored_rollout()
    keys = [tuple(r) for r in (exp.response_ids * exp.response_mask.astype("int64")).numpy().tolist()]
    pairs, stats = learner.choose_pairs(exp, exp.scores.numpy(), keys)
    assert len(pairs) >= 1 and stats["online_dpo/judge_preference"] > 0.5
    texts = decode_responses(trainer.learner.tokenizer, exp.response_ids, exp.response_mask)
    judge = learner.choose_pairs.judge
    again = judge.compare([exp.src[c] for c in pairs.chosen], [texts[c] for c in pairs.chosen],
                          [texts[r] for r in pairs.rejected])
    assert all(p > 0.5 for p in again)
    assert stats["online_dpo/judge_preference"] == pytest.approx(float(np.mean(again)), abs=1e-6)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--judge_model", "policy", "--judge_pair_template", "nonesuch"], "judge_pair_template: judge template 'nonesuch'"),
        (["--judge_model", "policy", "--judge_template", "Rate {answer}"], "judge_template: the pointwise judge template lacks"),
        (["--judge_model", "{root}/no_judge"], "judge_model={root}/no_judge: no such directory"),
        (["--judge_template", "tiny"], "judge_template 'tiny' is read only with judge_model"),
        (["--judge_model", "policy", "--judge_pair_words", "A"], "judge_pair_words must be two comma-separated words"),
    ],
)
def test_judge_arguments_are_refused_before_models_load(extra, message, tmp_path, monkeypatch):
    import dpo.run_online_dpo as entry

    monkeypatch.setattr(entry, "build_ppo_models", lambda *a, **k: pytest.fail("models loaded"))
    extra = [e.replace("{root}", str(tmp_path)) for e in extra]
    with pytest.raises(ValueError, match=message.replace("{root}", str(tmp_path)).replace("(", r"\(")):
        build_trainer(online_argv(str(tmp_path / "no_model"), str(tmp_path), str(tmp_path / "out"), *extra))
