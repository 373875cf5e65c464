"""The generative judge: its verdict math by hand, templates and verdict tokens, the engine's
prefill-only logits against a plain forward, the `judge` scorer (batched, on the reward server),
and the pairwise mode's order averaging."""
import json
import math

import numpy as np
import paddle
import pytest

from ppo.algos import expected_score, order_averaged_preference, verdict_probability
from ppo.judge.templates import first_token_ids, render, single_token_ids, template_text


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


# ---------------------------------------------------------------- verdict math (hand-derived)


def test_verdict_probability_by_hand():
    """z_yes = ln 3, z_no = 0: P = 3 / (3 + 1) = 3/4 whatever the other logits (renormalised over
    the two); equal logits: 1/2."""
    logits = t([[math.log(3.0), 0.0, 50.0], [1.0, 1.0, -7.0]])
    np.testing.assert_allclose(verdict_probability(logits, 0, 1).numpy(), [0.75, 0.5], rtol=1e-12)
    np.testing.assert_allclose(verdict_probability(logits, 1, 0).numpy(), [0.25, 0.5], rtol=1e-12)


def test_expected_score_by_hand():
    """Score tokens 0, 1, 2 valued 1, 2, 3 with probabilities (1/2, 1/4, 1/4) after
    renormalising: E = 1/2 + 2/4 + 3/4 = 1.75 -> (1.75 - 1) / 2 = 0.375; all equal: E = 2 -> 0.5."""
    logits = t([[math.log(2.0), 0.0, 0.0, 9.0], [0.3, 0.3, 0.3, -1.0]])
    np.testing.assert_allclose(expected_score(logits, [0, 1, 2], [1, 2, 3]).numpy(), [0.375, 0.5], rtol=1e-12)
    with pytest.raises(ValueError, match="not all be equal"):
        expected_score(logits, [0, 1], [2, 2])


def test_order_averaging_cancels_position_bias():
    """A judge that says "A" with 0.9 whichever answer is first has no preference: 1/2.
    p(A | a first) = 0.8, p(A | b first) = 0.4: (0.8 + 0.6) / 2 = 0.7."""
    out = order_averaged_preference(t([0.9, 0.8]), t([0.9, 0.4])).numpy()
    np.testing.assert_allclose(out, [0.5, 0.7], rtol=1e-12)


def test_verdict_math_is_row_wise_and_does_not_mutate():
    rng = np.random.default_rng(0)
    logits = t(rng.normal(size=(5, 7)))
    before = logits.numpy().copy()
    whole = expected_score(logits, [2, 4, 6], [1, 5, 10]).numpy()
    rows = [float(expected_score(logits[i:i + 1], [2, 4, 6], [1, 5, 10])) for i in range(5)]
    np.testing.assert_allclose(whole, rows, rtol=1e-12)
    np.testing.assert_array_equal(logits.numpy(), before)


# ---------------------------------------------------------------- templates and verdict tokens


def test_render_is_literal_and_needs_a_reference_when_asked():
    text = render(template_text("correct"), question="f({x})?", answer="{answer}")
    assert "Question: f({x})?" in text and "Answer: {answer}" in text
    with pytest.raises(ValueError, match="no reference"):
        render(template_text("correct_with_reference"), question="q", answer="a", reference=" ")
    with pytest.raises(ValueError, match="neither a built-in name"):
        template_text("no_such_template")


def test_verdict_tokens_are_refused_when_ambiguous(tiny_model_dir):
    from ppo.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    yes, no = first_token_ids(tok, ["Yes", "No"])
    assert yes != no and tok.convert_ids_to_tokens(yes) == "Y"
    with pytest.raises(ValueError, match="start with the same token"):
        first_token_ids(tok, ["Yes", "Yay"])
    with pytest.raises(ValueError, match=r"\['10'\] are not single tokens"):
        single_token_ids(tok, [str(i) for i in range(1, 11)])
    assert len(single_token_ids(tok, [str(i) for i in range(1, 10)])) == 9


# ---------------------------------------------------------------- prefill-only logits


def test_prefill_logits_equal_the_plain_forward(tiny_model_dir):
    """Left-padded prompts of different lengths: the engine's prefill gives the logits of the
    model's own forward at the last position (and the model keeps its train mode)."""
    from ppo.models.loading import load_causal_lm
    from ppo.rollout import RolloutEngine
    from ppo.rollout.prefill import prefill_logits

    model = load_causal_lm(tiny_model_dir)
    model.train()
    ids = paddle.to_tensor([[3, 3, 1, 7, 8, 9], [1, 5, 6, 7, 8, 9]], dtype="int64")
    mask = paddle.to_tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype="int64")
    fast = prefill_logits(RolloutEngine(model, 2, 3), ids, mask)
    plain = prefill_logits(RolloutEngine(model, 2, 3, use_rollout_engine=False), ids, mask)
    assert model.training
    model.eval()
    alone = model(input_ids=paddle.to_tensor([[1, 7, 8, 9]]), return_dict=True).logits[0, -1]
    np.testing.assert_allclose(fast.numpy(), plain.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fast.numpy()[0], alone.numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="LEFT-padded"):
        prefill_logits(RolloutEngine(model, 2, 3), ids, paddle.to_tensor([[1, 1, 1, 1, 0, 0]] * 2, dtype="int64"))


# ---------------------------------------------------------------- the judge and its scorer


@pytest.fixture(scope="module")
def judge(tiny_model_dir):
    from ppo.judge.model_judge import GenerativeJudge

    return GenerativeJudge.from_pretrained(tiny_model_dir, template="tiny", pair_template="tiny_better", batch_size=3)


def test_judge_score_is_the_verdict_probability_of_a_plain_forward(judge, tiny_model_dir):
    from ppo.models.loading import load_causal_lm, load_tokenizer

    questions, answers = ["Reverse: abc", "Reverse: 12345", "Reverse: j0", "Reverse: 9"], ["cba", "54312", "", "9"]
    scores = judge.score(questions, answers)
    tok, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)
    model.eval()
    yes, no = tok.convert_tokens_to_ids(["Y", "N"])
    for q, a, s in zip(questions, answers, scores):
        ids = tok(f"USER: {q} ASSISTANT:{a} Judge:")["input_ids"]
        z = model(input_ids=paddle.to_tensor([ids]), return_dict=True).logits[0, -1].numpy()
        np.testing.assert_allclose(s, 1.0 / (1.0 + math.exp(-(z[yes] - z[no]))), rtol=1e-4)


def test_pairwise_compare_is_antisymmetric(judge):
    """Both orders are asked and averaged, so swapping the answers gives 1 - p exactly."""
    q, a, b = ["Reverse: abc", "Reverse: 4567"], ["cba", "7654"], ["bca", "7645"]
    ab, ba = judge.compare(q, a, b), judge.compare(q, b, a)
    np.testing.assert_allclose(np.array(ab) + np.array(ba), 1.0, rtol=1e-6)
    assert all(0.0 < p < 1.0 for p in ab)


def test_judge_scorer_scores_batches_and_serves(tiny_model_dir, judge):
    """The registry entry with options scores a batch in one call (`score_batch`), and the reward
    server answers the same scores; without a model option it refuses."""
    from ppo.reward_server import create_app
    from ppo.scoring.registry import WeightedScorer, build_scorer

    spec = {"judge": {"model": tiny_model_dir, "template": "tiny", "pair_template": "tiny_better"}}
    scorer = WeightedScorer(spec)
    src, tgt, resp = ["Reverse: abc", "Reverse: 123"], ["cba", "321"], ["cba", "312"]
    totals, per_function = scorer.score_batch(src, tgt, resp)
    np.testing.assert_allclose(totals, judge.score(src, resp), rtol=1e-6)
    assert scorer.functions[0].score_batch is not None and scorer.verdicts(per_function) == [s >= 0.5 for s in totals]
    app = create_app(json.dumps(spec))
    reply = app.test_client().post("/", json={"src": src, "tgt": tgt, "response": resp}).get_json()
    np.testing.assert_allclose(reply["score"], totals, rtol=1e-6)
    with pytest.raises(ValueError, match="needs the option model"):
        build_scorer("judge")("Reverse: abc", "cba", "cba")


def test_judge_data_records_match_the_templates(tmp_path):
    from ppo.tiny.judge_data import generate

    pair = {"prompt": "Reverse: abc", "response_0": "bca", "response_1": "cba", "better_response_id": 1}
    (tmp_path / "preference.jsonl").write_text(json.dumps(pair) + "\n")
    assert generate(str(tmp_path), num_pairs=10, seed=0, keep_task=False) == 4
    records = sorted((r["src"][0], r["tgt"][0]) for r in map(json.loads, open(tmp_path / "judge.jsonl")))
    assert records == sorted([
        ("USER: Reverse: abc ASSISTANT:cba Judge:", "Yes"), ("USER: Reverse: abc ASSISTANT:bca Judge:", "No"),
        ("USER: Reverse: abc ASSISTANT:cba USER: Reverse: abc ASSISTANT:bca Better:", "A"),
        ("USER: Reverse: abc ASSISTANT:bca USER: Reverse: abc ASSISTANT:cba Better:", "B"),
    ])
    assert records[1][0] == render(template_text("tiny_better"), question="Reverse: abc", answer_a="bca", answer_b="cba")


def test_reference_layout_records_and_error_prefixes(tmp_path):
    """`tiny_reference` records carry the correct answer as the reference, reference character k
    stands len(reference) + 11 characters before answer character k, and an error prefix ends on
    the worse answer's first wrong character."""
    from ppo.tiny.judge_data import first_error, generate

    pair = {"prompt": "Reverse: abcd", "response_0": "dcab", "response_1": "dcba", "better_response_id": 1}
    (tmp_path / "preference.jsonl").write_text(json.dumps(pair) + "\n")
    n = generate(str(tmp_path), 10, 0, "r.jsonl", keep_task=False, layout="tiny_reference", pairwise=False,
                 error_prefixes=True)
    records = sorted((r["src"][0], r["tgt"][0]) for r in map(json.loads, open(tmp_path / "r.jsonl")))
    assert n == 3 and records == sorted([
        ("USER: Reverse: abcd REF:dcba ASSISTANT:dcba Judge:", "Yes"),
        ("USER: Reverse: abcd REF:dcba ASSISTANT:dcab Judge:", "No"),
        ("USER: Reverse: abcd REF:dcba ASSISTANT:dca Judge:", "No"),
    ])
    text = next(src for src, verdict in records if verdict == "Yes")
    ref, ans = text.index("REF:") + 4, text.index("ASSISTANT:") + 10
    assert ans - ref == len("dcba") + 11 and text[ref:ref + 4] == text[ans:ans + 4]
    assert first_error("dcab", "dcba") == 2 and first_error("dc", "dcba") == 2 and first_error("dcba", "dcba") is None
    assert first_error("", "dcba") == 0 and first_error("dcbaa", "dcba") == 4
    with pytest.raises(ValueError, match="layout 'nope'"):
        generate(str(tmp_path), 10, layout="nope")
    with pytest.raises(ValueError, match="no reference"):
        render(template_text("tiny_reference"), question="Reverse: ab", answer="ba", reference="")


def test_near_misses_are_wrong_answers_of_the_same_length():
    """`near_miss` never returns the correct answer, keeps its length and letters' count, and
    `near_misses` adds a Yes/No record pair per draw (the default data are unchanged)."""
    import random

    from ppo.tiny.judge_data import judgement_records, near_miss

    rng = random.Random(0)
    drawn = [near_miss("4k2ab", rng) for _ in range(200)]
    assert all(w != "4k2ab" and len(w) == 5 for w in drawn if w is not None)
    assert "k42ab" in drawn and any(w is not None and w[2:] != "2ab" for w in drawn)  # the flaw and a later swap
    pairs = [("Reverse: ba2k4", "4k2ab", "k42ab")]
    plain = judgement_records(pairs, keep_task=False, pairwise=False)
    more = judgement_records(pairs, keep_task=False, pairwise=False, near_misses=3, rng=random.Random(2))
    assert len(plain) == 2 and more[:2] == plain and len(more) == 8  # distinct letters: no draw is None
    assert [r["tgt"][0] for r in more[2:]] == ["Yes", "No"] * 3
    assert all(r["src"][0].startswith("USER: Reverse: ba2k4 ASSISTANT:") for r in more)


def test_fetch_records_ask_for_the_compared_characters():
    from ppo.tiny.judge_data import judgement_records

    records = judgement_records([("Reverse: ba2k4", "4k2ab", "k42ab")], keep_task=False, pairwise=False, fetch=True)
    assert [(r["src"][0], r["tgt"][0]) for r in records[2:]] == [
        ("USER: Reverse: ba2k4 ASSISTANT:4k2ab Given:", "4k"), ("USER: Reverse: ba2k4 ASSISTANT:4k2ab Wanted:", "4k"),
        ("USER: Reverse: ba2k4 ASSISTANT:k42ab Given:", "k4"), ("USER: Reverse: ba2k4 ASSISTANT:k42ab Wanted:", "4k")]
    assert len(judgement_records([("Reverse: ab", "ba", "")], keep_task=False, pairwise=False, fetch=True)) == 2  # an empty worse answer: none


def test_prefix_records_check_every_character_and_refuse_an_early_stop():
    """`prefixes`: each proper prefix written unfinished (`...`) is `Yes` up to the first wrong
    character and `No` from it on; one proper prefix of the correct answer, unmarked, is `No`."""
    import random

    from ppo.tiny.judge_data import judgement_records

    records = judgement_records([("Reverse: ba2k", "k2ab", "2kab")], keep_task=False, pairwise=False, prefixes=True,
                                rng=random.Random(0))
    got = [(r["src"][0][len("USER: Reverse: ba2k ASSISTANT:"):], r["tgt"][0]) for r in records]
    assert got[:2] == [("k2ab Judge:", "Yes"), ("2kab Judge:", "No")]
    assert got[2:8] == [("k... Judge:", "Yes"), ("k2... Judge:", "Yes"), ("k2a... Judge:", "Yes"),
                        ("2... Judge:", "No"), ("2k... Judge:", "No"), ("2ka... Judge:", "No")]
    early, verdict = got[8]
    assert verdict == "No" and early[:-len(" Judge:")] in ("k", "k2", "k2a") and len(got) == 9
    near = judgement_records([("Reverse: ba2k", "k2ab", "2kab")], keep_task=False, pairwise=False, prefixes=True,
                             near_misses=1, rng=random.Random(0))
    assert [r["tgt"][0] for r in near[9:]][-2:] == ["Yes", "No"]  # the near-miss pair, whole, ends the record list


def test_a_deepened_policy_computes_the_same_logits(tiny_model_dir, tmp_path):
    """`ppo.tiny.deepen`: two appended layers whose output projections start at zero leave every
    logit as it was; their other weights are drawn, and the input state is not written into."""
    from ppo.models.loading import load_causal_lm
    from ppo.tiny.deepen import deepen, deepened_state

    assert deepen(tiny_model_dir, str(tmp_path / "deep"), extra_layers=2) == 3  # the fixture has one layer
    ids = paddle.to_tensor([[1, 7, 8, 9, 10, 11]], dtype="int64")
    models = [load_causal_lm(path) for path in (tiny_model_dir, str(tmp_path / "deep"))]
    for m in models:
        m.eval()
    base, deep = (m(input_ids=ids, return_dict=True).logits.numpy() for m in models)
    np.testing.assert_allclose(deep, base, rtol=1e-5, atol=1e-6)
    layer = {n: p.numpy() for n, p in models[1].named_parameters() if n.startswith("llama.layers.2.")}
    assert not layer["llama.layers.2.self_attn.o_proj.weight"].any() and layer["llama.layers.2.self_attn.q_proj.weight"].std() > 0
    state = {"llama.layers.0.mlp.down_proj.weight": np.ones([2, 2], "float32")}
    out = deepened_state(state, 1, 1)
    assert state.keys() == {"llama.layers.0.mlp.down_proj.weight"} and not out["llama.layers.1.mlp.down_proj.weight"].any()
