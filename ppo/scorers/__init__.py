"""Rule-based scorers for the HTTP reward server (`ppo/reward_server.py`).

A scorer is a PURE function ``score(src: str, tgt: str, response: str) -> float``:
``src`` is the decoded prompt, ``tgt`` the label of the prompt (the dataset's
``tgt``), ``response`` the decoded completion without the prompt. This is the
triple PaddleNLP's trainer posts to its reward server (its
``request_reward_server`` decodes ``input_ids[:, :prompt_len]`` as src, the label
ids as tgt and ``input_ids[:, prompt_len:]`` as response). A scorer keeps no state
that changes its answers and may be called from many server threads at once (``code``
runs the answer in a sandboxed child process, ``math_boxed`` its sympy check in a
worker process: see their modules).

A scorer that cannot score an item (for example a label it cannot parse) raises
an exception; the server then answers HTTP 500 naming the item. It never returns
a made-up value such as 0.0: a reward that cannot be computed is an error.

Built-in scorers (chosen by name; ``ppo/verifiers/``, one module each, and the table in
docs/verifiers.md, generated from their facts by ``scripts/gen_verifier_table.py``):

- ``kk``: Knights and Knaves, PaddleNLP's rules (see :func:`kk_score`);
- ``math``: last number of the response equals the last number of the label
  (see :func:`math_score`);
- ``reverse``: the toolkit's demo task, exact match after stripping whitespace
  (see :func:`reverse_score`);
- the verifiers ``math_boxed``, ``gsm8k``, ``gsm8k_flexible``, ``format``, ``code``,
  ``choice`` and the penalties ``length`` and ``repetition``.

Every entry carries :class:`ScorerFacts` (``ppo/scoring/registry.py``): its values, what the
label holds, when it gives its lowest value and when it raises, the score of a correct answer
and its options.

A zero is not an error
----------------------
A wrong answer, or one that cannot be read (no number, no ``\\boxed{}``, no code block),
is a legitimate score: the answer's fault, scored as wrong (0 for the verifiers). A reward
that cannot be computed (a label that cannot be parsed, tests that are not valid, a sandbox
that cannot start) is the data's or the machine's fault: the scorer raises.

Several scorers with weights
----------------------------
:class:`WeightedScorer` combines scorers by name: ``total = sum_k w_k * score_k``
(``--scorer kk,math --weights 1,0.5`` on the server; ``rule_reward_scorers`` /
``rule_reward_weights`` in the trainer with ``use_rule_reward``). A mapping sets weights
and options in one place, in an argument file
``"rule_reward_scorers": {"math_boxed": 1.0, "format": {"weight": 0.2, "allow_outside": true}}``
or on the command line as that JSON object. Both use
:meth:`WeightedScorer.score_batch`, which returns the totals and each function's
scores, and raises :class:`ScorerError` naming the scorer and the item when one
raises or returns something that is not a finite number.

Adding your own scorer
----------------------
Register a function under a name, in a module of yours::

    # my_rewards.py
    from ppo.scorers import register_scorer

    @register_scorer("length_penalty")
    def length_penalty(src, tgt, response):
        return 1.0 if response.strip() == tgt.strip() else -0.01 * len(response)

and either import that module before creating the app
(``create_app("length_penalty")``), or skip registration entirely and name the
function on the command line as ``module.path:function``::

    python ppo/reward_server.py --scorer my_rewards:length_penalty

:func:`get_scorer` imports the module (the server script also searches the
directory it is started from), registers the function under the name
``my_rewards:length_penalty`` and returns it.
"""
from ..scoring.registry import (  # noqa: F401 (the registry's public names)
    Scorer,
    ScorerEntry,
    ScorerError,
    ScorerFacts,
    WeightedScorer,
    build_scorer,
    get_scorer,
    is_real_number,
    list_scorers,
    load_scorer,
    parse_scorer_list,
    parse_scorer_spec,
    register_scorer,
    scorer_facts,
)
from ..verifiers import scorer_settings_table, verifier_table  # noqa: F401,E402 (registers the built-in scorers)
from .. import judge  # noqa: F401,E402 (registers the model judge, ppo/judge/scorer.py)
from ..verifiers.basic import MATH_ABS_TOL, MATH_REL_TOL, last_number, math_score, reverse_score  # noqa: F401,E402
from ..verifiers.kk import (  # noqa: F401,E402
    KK_ANSWER_CORRECT,
    KK_ANSWER_UNPARSEABLE,
    KK_ANSWER_WRONG,
    KK_FORMAT_REWARD,
    kk_format_ok,
    kk_score,
    parse_kk_answer,
    parse_kk_label,
)
