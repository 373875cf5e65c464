"""A rule scorer with a setting of its own, from a module outside the package (one file, written
here into tmp_path, nothing of the package edited): `rule_reward_scorers` names it as
`module:function` with its setting in the argument file's mapping, the real argument parsing and
start-up pass read it, the scorer the trainer builds (`score_sources`) receives it, and a
misspelt option or a value outside the declaration is refused in one line naming the key, before
any model loads (exit status 2 through `ppo/run_ppo.py`)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments
from ppo.scorers import list_scorers, scorer_facts
from ppo.trainer.scoring import score_sources
from tests.plugin_helpers import forget_module, write_plugin_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = (ModelArgument, DataArgument, PPOTrainingArguments)
PLUGIN = textwrap.dedent('''
    """A scorer of one's own: `scale` for a response equal to the label, else 0."""
    from ppo.algos import Setting
    from ppo.scorers import ScorerFacts, register_scorer

    BUILT = []


    def make_scaled_match(scale=1.0):
        BUILT.append(scale)

        def scaled_match(src, tgt, response):
            return scale if response.strip() == tgt.strip() else 0.0

        return scaled_match


    scaled_match = register_scorer(__name__ + ".scaled_match", make_scaled_match(), ScorerFacts(
        summary="the stripped response equals the label: scale, else 0", values="{0, scale}", label="the answer",
        correct_at=1.0, build=make_scaled_match,
        settings=(Setting("scale", float, 1.0, "The score of a correct answer.", bounds=(0.0, False, None, False)),)))
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The module name of the outside scorer (importable from tmp_path; the one file written)."""
    name = write_plugin_module(tmp_path, monkeypatch, "outside_scorer", PLUGIN)
    yield name
    forget_module(name)


def argument_file(tmp_path, scorers, **keys):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"use_rule_reward": True, "rule_reward_scorers": scorers, **keys,
                                "output_dir": str(tmp_path / "out"), "max_steps": 1}))
    return str(path)


def test_an_outside_scorer_setting_reaches_the_scorer(tmp_path, plugin):
    spec = f"{plugin}:scaled_match"
    assert spec not in list_scorers() and plugin not in sys.modules  # nothing of it is in the package
    model_args, _, _ = parse_arguments(CLASSES, [argument_file(tmp_path, {spec: {"weight": 2.0, "scale": 2.5}})])
    assert json.loads(model_args.rule_reward_scorers) == {spec: {"weight": 2.0, "scale": 2.5}}
    assert [s.name for s in scorer_facts(spec).settings] == ["scale"]  # the facts its module registered
    _, scorer = score_sources(model_args)  # the trainer's rule scorer
    totals, per_function = scorer.score_batch(["q", "q", "q"], ["42", "42", "7"], [" 42 ", "41", "7"])
    assert per_function == {spec: [2.5, 0.0, 2.5]} and totals == [5.0, 0.0, 5.0]
    assert sys.modules[plugin].BUILT[-1] == 2.5
    assert scorer.verdicts(per_function) == [True, False, True]


@pytest.mark.parametrize("options, problem", [
    ({"scale": -1.0}, "scale=-1.0 (must be > 0)"),
    ({"scale": "big"}, "scale='big' (must be float)"),
    ({"scael": 2.0}, "has no option 'scael' (did you mean 'scale'?); its options: scale"),
])
def test_a_bad_outside_scorer_option_is_one_line_naming_the_key(tmp_path, plugin, options, problem):
    path = argument_file(tmp_path, {f"{plugin}:scaled_match": options})
    with pytest.raises(ArgumentError) as err:
        parse_arguments(CLASSES, [path])
    what = f"scorer '{plugin}:scaled_match'"
    sep = " " if problem.startswith("has") else ": "
    assert str(err.value) == f"rule_reward_scorers / rule_reward_weights: {what}{sep}{problem}"


def test_the_entry_point_refuses_it_before_any_model_loads(tmp_path, plugin, tiny_model_dir, tiny_data_dir):
    """Through `ppo/run_ppo.py` on the tiny GRPO configuration: exit status 2, the one problem on
    stderr's last line without a traceback."""
    config = json.load(open(os.path.join(ROOT, "config/tiny/grpo_rule_argument.json")))
    config.update(actor_model_name_or_path=tiny_model_dir, train_datasets=f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl",
                  eval_datasets="", load_best_model_at_end=False)
    path = argument_file(tmp_path, {f"{plugin}:scaled_match": {"scale": 0.0}},
                         **{k: v for k, v in config.items() if k not in ("rule_reward_scorers", "output_dir", "max_steps")})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "plugin"), ROOT]))
    done = subprocess.run([sys.executable, "ppo/run_ppo.py", path], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (f"run_ppo.py: error: rule_reward_scorers / rule_reward_weights: "
                                                     f"scorer '{plugin}:scaled_match': scale=0.0 (must be > 0)")
    assert "Traceback" not in done.stderr


def test_a_build_function_that_disagrees_with_its_declaration_is_refused():
    """A build default that differs from the declared one is refused when the facts are made."""
    from ppo.algos import Setting
    from ppo.scorers import ScorerFacts

    def make(scale=2.0):
        return lambda src, tgt, response: scale

    with pytest.raises(ValueError, match=r"declares 'scale' with default 1.0, but .*make defaults it to 2.0"):
        ScorerFacts(summary="s", build=make, settings=(Setting("scale", float, 1.0, "h"),))
