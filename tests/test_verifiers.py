"""Verifiers on tables of tricky answers (tests/verifier_tables.py), the line between a legitimate
zero and an error, options from the mapping form, and the registry's facts and table."""
import json
import logging

import pytest

from ppo.scorers import WeightedScorer, get_scorer, list_scorers, parse_scorer_spec, scorer_facts
from tests.verifier_tables import GSM8K, MATH_BOXED

VERIFIERS = ("math_boxed", "gsm8k", "gsm8k_flexible", "format", "code", "choice", "length", "repetition")


@pytest.mark.parametrize("response, label, strict, flexible", GSM8K)
def test_gsm8k_agrees_with_paddlenlp_rule(response, label, strict, flexible):
    assert get_scorer("gsm8k")("", label, response) == strict
    assert get_scorer("gsm8k_flexible")("", label, response) == flexible


@pytest.mark.parametrize("label", ["", "seventy-two", "1,000", "1/2", "#### "])
def test_gsm8k_label_that_is_no_number_raises(label):
    with pytest.raises(ValueError, match="gsm8k label"):
        get_scorer("gsm8k")("", label, "#### 72")


@pytest.mark.parametrize("response, label, expected", MATH_BOXED)
def test_math_boxed_table(response, label, expected):
    assert get_scorer("math_boxed")("", label, response) == expected


def test_math_boxed_without_sympy_option_keeps_exact_rules_only():
    plain = WeightedScorer({"math_boxed": {"symbolic": False}}).functions[0]
    assert plain("", "0.5", r"\boxed{\frac12}") == 1.0  # exact numbers need no sympy
    assert plain("", r"\pi \cdot 2", r"\boxed{2\pi}") == 0.0  # the symbolic rule is off


@pytest.mark.parametrize("label", ["", "   ", r"\boxed{1", r"\boxed{}"])
def test_math_boxed_label_that_cannot_be_read_raises(label):
    with pytest.raises(ValueError, match="math_boxed label"):
        get_scorer("math_boxed")("", label, r"\boxed{1}")


def test_math_boxed_symbolic_check_past_its_limit_is_a_warned_zero(caplog):
    """sympy evaluates 9^(9^9) exactly: the child is stopped by its limits, the answer scores 0
    and a warning names it; the worker keeps serving the next check."""
    scorer = WeightedScorer({"math_boxed": {"timeout_s": 1}}).functions[0]
    with caplog.at_level(logging.WARNING, logger="ppo.verifiers.math_boxed"):
        assert scorer("", "1", r"\boxed{9^{9^{9}}}") == 0.0
    assert "9^{9^{9}}" in caplog.text
    assert scorer("", "(x+1)^2", r"\boxed{x^2+2x+1}") == 1.0


def test_symbolic_syntax_is_a_whitelist():
    from ppo.verifiers.symbolic import to_sympy_syntax

    assert to_sympy_syntax(r"\frac{\sqrt{3}}{2}") == "((sqrt(3))/(2))"
    assert to_sympy_syntax("2xy") == "2x*y"
    for hostile in ("__import__('os')", "x.__class__", r"\input{x}", "a;b", "[1,2]", "f(x)=1", "x.y"):
        assert to_sympy_syntax(hostile) is None, hostile


FORMAT_CASES = [
    ("<think>a</think><answer>42</answer>", 1.0),
    ("<think>a</think>\n<answer> 42 </answer>\n", 1.0),
    ("<answer>42</answer>", 0.0),  # no think block
    ("<think>a</think><answer>  </answer>", 0.0),  # empty answer
    ("<answer>42</answer><think>a</think>", 0.0),  # out of order
    ("<think>a</think><think>b</think><answer>42</answer>", 0.0),  # two think blocks
    ("Sure! <think>a</think><answer>42</answer>", 0.0),  # text outside
    ("<think>a<answer>42</answer></think>", 0.0),  # answer inside think
    ("42", 0.0),  # right number, no format
]


@pytest.mark.parametrize("response, expected", FORMAT_CASES)
def test_format_table(response, expected):
    assert get_scorer("format")("", "", response) == expected


def test_format_options_and_prompt_opening_the_block():
    loose = WeightedScorer({"format": {"think_tag": "reasoning", "answer_tag": "solution", "allow_outside": True,
                                       "require_think": False}}).functions[0]
    assert loose("", "", "Sure. <solution>4</solution> Done.") == 1.0
    assert loose("", "", "<reasoning>x</reasoning><reasoning>y</reasoning><solution>4</solution>") == 0.0
    assert loose("", "", "<think>x</think><answer>4</answer>") == 0.0
    fmt = get_scorer("format")
    assert fmt("USER: q ASSISTANT: <think>", "", "a</think><answer>4</answer>") == 1.0
    assert fmt("USER: q ASSISTANT:", "", "a</think><answer>4</answer>") == 0.0
    with pytest.raises(ValueError, match="tag names"):
        WeightedScorer({"format": {"answer_tag": "<answer>"}})


CHOICE_CASES = [
    ("The answer is B.", "B", 1.0),
    ("The answer is (C)", "(C)", 1.0),
    ("**Answer:** D", "Answer: D", 1.0),
    (r"Thus \boxed{B}", "b", 1.0),
    (r"\boxed{\text{(A)}}", "A", 1.0),
    ("(b)", "B", 1.0),
    ("A cat sat on the mat.", "A", 0.0),  # an article, not a choice
    ("The answer is a bit unclear.", "A", 0.0),
    ("The answer is B, no wait, the answer is C", "C", 1.0),  # the last one
    ("The answer is K", "K", 0.0),  # outside A-J: unreadable, although it matches the label text
]


@pytest.mark.parametrize("response, label, expected", CHOICE_CASES[:-1])
def test_choice_table(response, label, expected):
    assert get_scorer("choice")("", label, response) == expected


def test_choice_options_and_bad_labels():
    with pytest.raises(ValueError, match="choice label"):
        get_scorer("choice")("", "K", CHOICE_CASES[-1][0])
    abcd = WeightedScorer({"choice": {"choices": "ABCD"}}).functions[0]
    assert abcd("", "D", "The answer is D") == 1.0
    assert abcd("", "D", "The answer is E") == 0.0
    with pytest.raises(ValueError, match="choice label"):
        abcd("", "E", "E")
    with pytest.raises(ValueError, match="choice label"):
        get_scorer("choice")("", "the second one", "B")


def test_length_penalty_hand_computed():
    """max 10 chars, buffer 4: 0 up to 6 chars, then -(len - 6) / 4, floor -1."""
    length = WeightedScorer({"length": {"max_chars": 10, "buffer_chars": 4}}).functions[0]
    assert [length("", "", "x" * n) for n in (0, 6, 7, 8, 10, 50)] == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]


def test_repetition_penalty_hand_computed():
    """'a b c a b c' has 4 word 3-grams, 3 distinct: -1 * (1 - 3/4) = -0.25."""
    rep = get_scorer("repetition")
    assert rep("", "", "a b c a b c") == -0.25
    assert rep("", "", "one two three four") == 0.0
    assert rep("", "", "too short") == 0.0
    assert rep("", "", "la " * 100) == pytest.approx(-(1 - 1 / 98))
    half = WeightedScorer({"repetition": {"ngram_size": 1, "max_penalty": -0.5}}).functions[0]
    assert half("", "", "x x y y") == -0.25


def test_every_verifier_is_registered_with_facts():
    names = set(list_scorers())
    for name in VERIFIERS + ("kk", "math", "reverse"):
        assert name in names and scorer_facts(name) is not None, name
        facts = scorer_facts(name)
        assert facts.summary and facts.values and facts.raises_when
        if facts.options:
            get_scorer(name)  # the default instance is the build with the default options
            assert set(facts.options) <= set(facts.build.__code__.co_varnames)
    assert scorer_facts("length").correct_at is None and scorer_facts("gsm8k").correct_at == 1.0


def test_mapping_spec_weights_options_and_errors():
    spec = '{"math_boxed": 1.0, "format": {"weight": 0.2, "allow_outside": true}}'
    entries = parse_scorer_spec(spec)
    assert [(e.name, e.weight, dict(e.options)) for e in entries] == [
        ("math_boxed", 1.0, {}), ("format", 0.2, {"allow_outside": True})]
    scorer = WeightedScorer(json.loads(spec))
    totals, parts = scorer.score_batch(["q", "q"], ["1/2", "1/2"], [
        r"ok <think>x</think><answer>\boxed{0.5}</answer>", r"<think>x</think><answer>\boxed{2}</answer>"])
    assert totals == [1.2, 0.2] and parts == {"math_boxed": [1.0, 0.0], "format": [1.0, 1.0]}
    assert scorer.verdicts(parts) == [True, False]
    assert scorer.answers(["q"], [r"\boxed{\dfrac{1}{2}}"]) == [r"\frac{1}{2}"]
    for bad, message in (({"format": {"colour": 1}}, "no option 'colour'"), ({"reverse": {"x": 1}}, "takes no options"),
                         ('{"gsm8k": "heavy"}', "is not a number"), ('{"gsm8k": 1', "not a JSON object")):
        with pytest.raises(ValueError, match=message):
            WeightedScorer(bad)
    with pytest.raises(ValueError, match="inside the scorer mapping"):
        parse_scorer_spec({"gsm8k": 1.0}, "2")
    with pytest.raises(ValueError, match="says which answers are correct"):
        WeightedScorer("length,repetition").verdicts({"length": [0.0], "repetition": [0.0]})


def test_rule_reward_arguments_take_the_mapping_from_an_argument_file():
    from ppo.common.argument_parsing import file_arguments_to_argv
    from ppo.entry.ppo_arguments import ModelArgument

    argv = file_arguments_to_argv({"rule_reward_scorers": {"gsm8k": 1.0, "format": {"weight": 0.2}}})
    m = ModelArgument(actor_model_name_or_path="a", use_rule_reward=True, rule_reward_scorers=argv[1])
    assert WeightedScorer(m.rule_reward_scorers, m.rule_reward_weights).weights == [1.0, 0.2]
    with pytest.raises(ValueError, match="no option 'colour'"):
        ModelArgument(actor_model_name_or_path="a", use_rule_reward=True,
                      rule_reward_scorers='{"format": {"colour": "red"}}')


def test_reward_server_serves_verifiers():
    from ppo.reward_server import create_app

    client = create_app('{"gsm8k": 1.0, "format": 0.5}').test_client()
    body = client.post("/", data=json.dumps({"src": ["q", "q"], "tgt": ["72", "72"], "response": [
        "<think>x</think><answer>#### 72</answer>", "#### 71"]})).get_json()
    assert body["score"] == [1.5, 0.0] and body["scores_per_function"] == {"gsm8k": [1.0, 0.0], "format": [1.0, 0.0]}
    bad = client.post("/", data=json.dumps({"src": ["q"], "tgt": ["seventy"], "response": ["#### 70"]}))
    assert bad.status_code == 500 and "score" not in bad.get_json() and "gsm8k label" in bad.get_json()["error_msg"]


def test_verifier_table_in_docs_is_up_to_date():
    from scripts.gen_verifier_table import main as gen_verifier_table

    assert gen_verifier_table(["--check"]) == 0, "run: python scripts/gen_verifier_table.py"
