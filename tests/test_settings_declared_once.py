"""Every setting declared once: a field of ours carries its range in its declaration (no module-level
table of ranges), online DPO's `judge_*` fields come from the judge scorer's declarations, and the
PPO clip loss guards its arguments with the declarations the argument checks use."""
import ast
import dataclasses
import importlib
import os

import pytest

from ppo.common.entry_points import ENTRY_POINTS
from ppo.common.field_bounds import PADDLENLP_BOUNDS, bounds_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = ("ppo", "dpo", "sft", "rm", "rl")
BOUND_WORDS = ("RANGE", "BOUND", "MIN", "MAX", "ABOVE", "BELOW", "LIMIT")


def argument_classes():
    return {getattr(importlib.import_module(ref.split(":")[0]), ref.split(":")[1])
            for entry in ENTRY_POINTS for ref in entry.arguments}


def our_fields():
    """name -> the classes of this repository that declare a field of that name (PaddleNLP's own excluded)."""
    found = {}
    for cls in argument_classes():
        for base in cls.__mro__:
            if base.__module__.split(".")[0] in LIBRARY:
                for name in vars(base).get("__annotations__", {}):
                    found.setdefault(name, set()).add(f"{base.__module__}.{base.__qualname__}")
    return found


def _number(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def looks_like_bounds(node, table_name):
    """A value of a range table: `(low, bool, high or None, bool)`, `("range"|"min"|"above", ...)`,
    or a bare number in a table whose name says it holds bounds (`MIN_VALUES`)."""
    if isinstance(node, ast.Tuple) and len(node.elts) == 4:
        low, low_in, high, high_in = node.elts
        flags = all(isinstance(n, ast.Constant) and isinstance(n.value, bool) for n in (low_in, high_in))
        if flags and _number(low) and (_number(high) or (isinstance(high, ast.Constant) and high.value is None)):
            return True
    if isinstance(node, ast.Tuple) and node.elts and isinstance(node.elts[0], ast.Constant):
        if node.elts[0].value in ("range", "min", "above"):
            return True
    return _number(node) and any(word in table_name.upper() for word in BOUND_WORDS)


def module_range_tables(fields):
    """`(file, line, table, field)` of every module-level dict of the library that maps a field of
    ours to bounds."""
    found = []
    for package in LIBRARY:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                for node in ast.parse(open(path, encoding="utf-8").read()).body:
                    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                    if not isinstance(getattr(node, "value", None), ast.Dict):
                        continue
                    table = " ".join(t.id for t in targets if isinstance(t, ast.Name))
                    for key, value in zip(node.value.keys, node.value.values):
                        if isinstance(key, ast.Constant) and key.value in fields and looks_like_bounds(value, table):
                            found.append((os.path.relpath(path, ROOT), node.lineno, table, key.value))
    return found


def test_no_field_of_ours_keeps_its_range_in_a_module_level_table():
    fields = our_fields()
    assert module_range_tables(fields) == []
    # the one table left holds PaddleNLP's own fields only, which no class of ours declares again
    from paddlenlp.trainer import TrainingArguments

    paddlenlp = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert sorted(set(PADDLENLP_BOUNDS) - paddlenlp) == []
    assert {name: sorted(fields[name]) for name in PADDLENLP_BOUNDS if name in fields} == {}


def test_the_detector_finds_a_range_table():
    fields = {"kl_coeff": None, "rollout_n": None}
    tree = ast.parse('VALUE_RANGES = {"kl_coeff": (0.0, True, None, False)}\nMIN_VALUES = {"rollout_n": 1}\n'
                     'DEFAULTS = {"rollout_n": 4}\nRULES = {"kl_coeff": ("range", 0.0, True, None, False)}')
    flagged = [node.targets[0].id for node in tree.body for k, v in zip(node.value.keys, node.value.values)
               if k.value in fields and looks_like_bounds(v, node.targets[0].id)]
    assert flagged == ["VALUE_RANGES", "MIN_VALUES", "RULES"]


def test_every_range_of_the_stored_table_comes_from_a_declaration():
    """The early check's ranges: a field's own rule (`ranged_field`), a registry `Setting`'s bounds,
    or, for PaddleNLP's fields, `PADDLENLP_BOUNDS`; and a few of ours are where they were."""
    from ppo.common.argument_table import entry_table
    from ppo.common.registry_settings import declarations_of

    fields, seen = our_fields(), {}
    for entry in ENTRY_POINTS:
        if not entry.arguments or entry.command not in ("ppo", "online-dpo", "audit-reward", "distill"):
            continue
        classes = [getattr(importlib.import_module(r.split(":")[0]), r.split(":")[1]) for r in entry.arguments]
        own = {n: list(rule) for cls in classes for n, rule in bounds_of(cls).items()}
        declared = {n: ["range", *found[0].bounds] for n, found in declarations_of(classes).items() if found[0].bounds}
        for name, rule in entry_table(classes)[0]["ranges"].items():
            expected = declared.get(name) or own.get(name)
            if name not in fields:
                expected = expected or list(PADDLENLP_BOUNDS[name])
            assert rule == expected, (entry.command, name)
            seen[name] = rule
    assert seen["kl_coeff"] == ["range", 0.0, True, None, False] and seen["rollout_n"] == ["min", 1]
    assert seen["top_p"] == ["range", 0.0, False, 1.0, True] and seen["reward_server_timeout"] == ["above", 0.0]
    assert seen["learning_rate"] == ["range", 0.0, True, None, False] and seen["batch_size"] == ["min", 1]
    assert seen["dual_clip"] == ["range", 1.0, False, None, False]


def test_online_dpo_judge_settings_are_the_judge_scorers():
    from dpo import online_dpo_arguments as online
    from ppo.judge import scorer

    declared = {s.name: s for s in scorer.SETTINGS}
    assert online.JUDGE_DEFAULTS == {
        "judge_template": declared["template"].default, "judge_pair_template": declared["pair_template"].default,
        "judge_words": f"{declared['yes'].default},{declared['no'].default}",
        "judge_pair_words": declared["pair_words"].default}
    assert online.JUDGE_DEFAULTS == {"judge_template": "correct", "judge_pair_template": "better",
                                     "judge_words": "Yes,No", "judge_pair_words": "A,B"}  # what users have
    fields = {f.name: f for f in dataclasses.fields(online.ModelArgument)}
    for name, setting in online.JUDGE_SETTINGS.items():
        assert fields[name].default == setting.default and fields[name].metadata["help"] == setting.help
        assert online.ModelArgument.setting_declarations[name] == (setting, "ppo.judge.scorer", "scorer judge")
    assert fields["judge_pair_template"].metadata["help"] == declared["pair_template"].help
    # by construction: another declaration of the scorer gives other defaults and help
    changed = [scorer.Setting(s.name, s.type, {"template": "tiny", "yes": "Ja", "pair_words": ("1", "2")}.get(s.name, s.default),
                              s.help + (" Changed." if s.name == "pair_template" else "")) for s in scorer.SETTINGS]
    derived = {s.name: s for s in online.judge_settings(changed)}
    assert {n: s.default for n, s in derived.items()} == {"judge_template": "tiny", "judge_pair_template": "better",
                                                          "judge_words": "Ja,No", "judge_pair_words": "1,2"}
    assert derived["judge_pair_template"].help.endswith(" Changed.")


def test_online_dpo_judge_rubrics_are_checked_by_the_scorers_check(monkeypatch):
    from dpo import online_dpo_arguments as online
    from ppo.common.argument_problems import ArgumentError
    from ppo.judge import scorer

    expected = scorer.rubric_problem("nonesuch", True)
    assert expected.startswith("judge template 'nonesuch' is neither a built-in name")
    with pytest.raises(ArgumentError) as err:
        online.ModelArgument(judge_model="policy", judge_pair_template="nonesuch")
    assert str(err.value).endswith(f"judge_pair_template: {expected}")
    monkeypatch.setattr(scorer, "rubric_problem", lambda value, pairwise: f"refused {value} ({pairwise})")
    with pytest.raises(ArgumentError, match=r"judge_template: refused tiny \(False\)"):
        online.ModelArgument(judge_model="policy", judge_template="tiny")


def test_the_ppo_clip_guard_is_the_declarations():
    import paddle

    from ppo.algos import POLICY_LOSSES, ppo_policy_loss
    from ppo.algos import losses

    declared = {s.name: s for s in POLICY_LOSSES["ppo_clip"].declared}
    assert declared["dual_clip"] is losses.DUAL_CLIP
    assert declared["importance_sampling_level"] is losses.IMPORTANCE_SAMPLING_LEVEL
    one = paddle.to_tensor([[0.0]])
    for bad, message in ((dict(dual_clip=1.0), losses.DUAL_CLIP.problem(1.0)),
                         (dict(importance_sampling_level="seq"), losses.IMPORTANCE_SAMPLING_LEVEL.problem("seq"))):
        with pytest.raises(ValueError) as err:
            ppo_policy_loss(one, one, one + 1, paddle.to_tensor([[1]]), **bad)
        assert str(err.value) == message
    assert message == "importance_sampling_level must be one of ('token', 'sequence'), got 'seq'"
    assert losses.DUAL_CLIP.problem(1.0) == "dual_clip=1.0 (must be > 1)"
    assert losses.DUAL_CLIP.problem(None) is None and losses.DUAL_CLIP.checked(1.5) == 1.5


def _written_default(value):
    """The default a hand-written field states (`x: float = 0.1` or `field(default=0.1, ...)`), or a
    marker when it states none."""
    if isinstance(value, ast.Constant):
        return value.value
    for keyword in getattr(value, "keywords", ()):
        if keyword.arg == "default" and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return _written_default


def test_preference_fields_are_the_registry_declarations():
    """The DPO trainer's loss fields come from `ppo.algos.PREFERENCE_SETTINGS` and the objective's
    `WEIGHT_SETTINGS` (defaults, help, ranges, order), `PREFERENCE_HYPERPARAMETERS` is derived from
    them, and no second table of their defaults is left in the library."""
    from dpo import preference_arguments as pa
    from dpo.preference_objective import WEIGHT_SETTINGS
    from ppo.algos import PREFERENCE_HYPERPARAMETERS, PREFERENCE_SETTINGS, Setting

    fields = {f.name: f for f in dataclasses.fields(pa.PreferenceLossArguments)}
    assert list(fields) == list(pa.FIELD_ORDER)  # the order users' --help had
    assert PREFERENCE_HYPERPARAMETERS == {n: s.default for n, s in PREFERENCE_SETTINGS.items()} == {
        "beta": 0.1, "label_smoothing": 0.0, "simpo_gamma": 0.5, "dpop_lambda": 50.0, "rdpo_alpha": 0.01,
        "desirable_weight": 1.0, "undesirable_weight": 1.0, "reference_free": False}  # what users have
    for name, setting in {**PREFERENCE_SETTINGS, **WEIGHT_SETTINGS}.items():
        assert fields[name].default == setting.default and fields[name].metadata["help"] == setting.help
        assert pa.PreferenceLossArguments.setting_declarations[name][0] is setting
    assert pa.PreferenceLossArguments.setting_declarations["reference_free"][1:] == (
        "ppo.algos.preference_registry", "loss_type sigmoid / ipo / hinge")
    assert pa.setting_origins()["beta"][1] == "loss_type all but rrhf / pro"
    # by construction: another declaration gives other fields, defaults, help and range checks
    changed = {n: Setting(n, s.type, {"beta": 0.25}.get(n, s.default), s.help + " Changed.", bounds=s.bounds)
               for n, s in PREFERENCE_SETTINGS.items()}
    changed["dpo_gamma"] = Setting("dpo_gamma", float, 2.0, "A new one.", bounds=(1.0, True, None, False))
    derived = {s.name: s for s in pa.preference_settings(changed)}
    assert list(derived)[-1] == "dpo_gamma" and derived["beta"].default == 0.25
    assert derived["simpo_gamma"].help == "SimPO target reward margin gamma. Changed."
    assert pa.range_problem(derived["dpo_gamma"], 0.5) == "dpo_gamma must be >= 1, got 0.5"
    # the DPO trainer's messages, from the declared bounds
    assert pa.range_problem(PREFERENCE_SETTINGS["beta"], -0.1) == "beta must be positive, got -0.1"
    assert pa.range_problem(PREFERENCE_SETTINGS["label_smoothing"], 0.7) == "label_smoothing must lie in [0, 0.5), got 0.7"
    assert pa.range_problem(WEIGHT_SETTINGS["pref_loss_ratio"], -2) == "pref_loss_ratio must be >= 0, got -2"
    assert pa.range_problem(PREFERENCE_SETTINGS["label_smoothing"], 0.49) is None
    # the early check leaves these ranges to the full pass (its wording), and nothing else declares their defaults
    assert set(pa.PreferenceLossArguments.full_pass_ranges) == {"beta", "label_smoothing", "sft_loss_ratio",
                                                                "pref_loss_ratio"}
    defaults = {n: s.default for n, s in {**PREFERENCE_SETTINGS, **WEIGHT_SETTINGS}.items()}
    names, tables = set(defaults), []
    for package in LIBRARY:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(f for f in files if f.endswith(".py")):
                for node in ast.walk(ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())):
                    if isinstance(node, ast.Dict):
                        keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                        if len(keys & names) >= 3 and all(isinstance(v, ast.Constant) for v in node.values):
                            tables.append((name, node.lineno))
                    if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) in names:
                        if _written_default(node.value) == defaults[node.target.id]:  # (distill's beta is another)
                            tables.append((name, node.lineno, node.target.id))  # a hand-written field
    assert tables == []


def test_preference_ranges_are_checked_in_the_trainers_words():
    from dpo.dpo_arguments import DPOTrainingArguments

    args = DPOTrainingArguments.__new__(DPOTrainingArguments)
    for f in dataclasses.fields(DPOTrainingArguments):
        if f.default is not dataclasses.MISSING:
            object.__setattr__(args, f.name, f.default)
    assert args.preference_loss_problems() == []
    args.beta, args.label_smoothing, args.pref_loss_ratio, args.sft_loss_ratio = -0.1, 0.7, -2.0, 0.0
    assert args.preference_loss_problems() == ["beta must be positive, got -0.1",
                                               "label_smoothing must lie in [0, 0.5), got 0.7",
                                               "pref_loss_ratio must be >= 0, got -2.0"]


def _library_trees():
    for package in LIBRARY:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT), ast.parse(open(path, encoding="utf-8").read())


def test_a_field_another_class_has_is_taken_not_written_again():
    """A field two classes of ours declare with the same default and help is written once: the
    others take it with `shared_field` (or give another default with `default_override`, which
    refuses the same default)."""
    from ppo.common.field_bounds import default_override
    from ppo.entry.argument_groups import OnlineRolloutArguments, RolloutArguments

    declared = {}  # (name, default, help) -> classes declaring it in their own body
    for cls in argument_classes():
        for base in cls.__mro__:
            if base.__module__.split(".")[0] in LIBRARY and dataclasses.is_dataclass(base):
                own = {f.name: f for f in dataclasses.fields(base) if f.name in vars(base).get("__annotations__", {})}
                for name, f in own.items():
                    default = f.default if f.default is not dataclasses.MISSING else f.default_factory
                    declared.setdefault((name, repr(default), f.metadata.get("help")), set()).add(base)
    written = {}  # (module, class, field) -> the declaration's source
    for path, tree in _library_trees():
        module = path[:-3].replace(os.sep, ".")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                        written[(module, node.name, item.target.id)] = ast.unparse(item.value)
    twice = []
    for (name, _, _), classes in declared.items():
        sources = [written.get((c.__module__, c.__qualname__, name), "") for c in classes]
        if len([s for s in sources if not s.startswith("shared_field(")]) > 1:
            twice.append((name, sorted(c.__qualname__ for c in classes)))
    assert twice == []
    assert {("temperature", "DistillArguments"), ("batch_size", "CostAuditArgument"), ("max_length", "CostAuditArgument")} <= {
        (n, c) for (_, c, n), s in written.items() if s.startswith("shared_field(")}
    with pytest.raises(ValueError, match=r"default_override\(RolloutArguments, 'max_dec_len', 64\) repeats"):
        default_override(RolloutArguments, "max_dec_len", 64)
    # the online loops' divergence stop: one override, which PPO/GRPO and online DPO inherit
    assert {f.name: f.default for f in dataclasses.fields(OnlineRolloutArguments)}["stop_on_divergence"] is True


def _field_defaults():
    """field name -> the set of defaults the classes of ours give it."""
    found = {}
    for cls in argument_classes():
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                found.setdefault(f.name, set()).add(repr(f.default))
    return found


def literal_default_tables(defaults):
    """`(file, line)` of every dict `{"field": default, ...}` or tuple `(("field", default), ...)` of
    the library naming two or more fields of ours, each with one of its declared defaults."""
    found = []
    for path, tree in _library_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                pairs = list(zip(node.keys, node.values))
            elif isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Tuple) and len(e.elts) == 2 for e in node.elts):
                pairs = [tuple(e.elts) for e in node.elts]
            else:
                continue
            hits = [k.value for k, v in pairs if isinstance(k, ast.Constant) and k.value in defaults
                    and isinstance(v, ast.Constant) and repr(v.value) in defaults[k.value]]
            if len(hits) >= 2:
                found.append((path, node.lineno))
    return found


def test_no_table_repeats_the_defaults_of_fields():
    """The defaults a check compares with (PRM settings set without a process reward model) are
    read from the declarations; the one table left is the saved score model's config format (how a
    config without those keys is read), not an argument's default."""
    from ppo.entry.paddlenlp_rl_arguments import PRM_DEFAULTS, PaddleNLPRLArguments

    tables = literal_default_tables(_field_defaults())
    assert [t for t in tables if t[0] != os.path.join("ppo", "models", "score_model.py")] == []
    assert PRM_DEFAULTS == {f.name: f.default for f in dataclasses.fields(PaddleNLPRLArguments) if f.name.startswith("prm_")}
    assert PRM_DEFAULTS == {"prm_reduction": "last", "prm_step_separator": "\n", "prm_step_tokens": 0, "prm_end_step": False}
    tree = ast.parse('PRM_FIELDS = (("placeholder_token", "x"), ("reward_tokens", "+,-"))\nD = {"a": 1, "b": 2}')
    flagged = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Tuple) and len(node.elts) == 2
               and all(isinstance(e, ast.Tuple) for e in node.elts)]
    assert flagged == [1]  # the detector's shape; its defaults check runs over the library above


def test_signature_defaults_fed_by_a_field_are_its_declaration():
    """The evaluation's long-answer length and the PRM dataset's tokens: the functions a field feeds
    default to the constant the field is declared with, never a second literal."""
    from ppo.data.process_reward import PLACEHOLDER_TOKEN, REWARD_TOKENS
    from ppo.entry.argument_groups import DatasetArguments
    from ppo.evaluation import LONG_ANSWER_LEN
    from rm.reward_arguments import DataArgument

    fields = {f.name: f.default for f in dataclasses.fields(DataArgument)}
    assert (fields["placeholder_token"], fields["reward_tokens"]) == (PLACEHOLDER_TOKEN, REWARD_TOKENS) == ("ки", "+,-")
    assert {f.name: f.default for f in dataclasses.fields(DatasetArguments)}["eval_long_answer_len"] == LONG_ANSWER_LEN == 5
    names = {"eval_long_answer_len", "long_answer_len", "placeholder_token", "reward_tokens"}
    literal = []
    for path, tree in _library_trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = list(zip((a.posonlyargs + a.args)[len(a.posonlyargs + a.args) - len(a.defaults):], a.defaults))
                params += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                literal += [(path, node.lineno, p.arg) for p, d in params if p.arg in names and isinstance(d, ast.Constant)]
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) == 3:
                if isinstance(node.args[1], ast.Constant) and node.args[1].value in names and isinstance(node.args[2], ast.Constant):
                    literal.append((path, node.lineno, node.args[1].value))
    assert literal == []


NEUTRAL = (None, True, False, "", 0, 1, -1, "none")  # "unset", "off" or the identity: not a setting's choice
OTHER = {("ppo/evaluation/generation.py", "batch_size"), ("ppo/evaluation/sampled.py", "batch_size"),
         ("ppo/scoring/process_reward.py", "batch_size"), ("ppo/judge/model_judge.py", "batch_size")}
"""Not the audit's `batch_size`: each function's own chunk size under the same name (its callers pass theirs)."""


def literal_parameter_defaults(defaults):
    """`(file, line, parameter)` of every function parameter of the library named as a field of ours
    whose default is a literal equal to one of that field's declared defaults (neutral values aside)."""
    found = []
    for path, tree in _library_trees():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            positional = a.posonlyargs + a.args
            params = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            params += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            for p, d in params:
                if p.arg in defaults and isinstance(d, ast.Constant) and repr(d.value) in defaults[p.arg]:
                    if not any(d.value == n and type(d.value) is type(n) for n in NEUTRAL) and not (
                            isinstance(d.value, float) and d.value in (0.0, 1.0)):
                        found.append((path, node.lineno, p.arg))
    return found


def test_functions_a_setting_feeds_default_to_its_declaration():
    """The losses, estimators, datasets and collators default to the constant or `Setting` their
    argument field is declared with (`clip_range_ratio=CLIP_RANGE_RATIO.default`, `gamma=GAMMA`),
    never to a second literal of the same value."""
    from ppo.algos import POLICY_LOSSES, PREFERENCE_SETTINGS, covariance_losses, losses, policy_losses, preference

    ours = our_fields()  # PaddleNLP's own fields (its seed=42 in the datasets' signatures) are PaddleNLP's to declare
    found = literal_parameter_defaults({n: d for n, d in _field_defaults().items() if n in ours})
    assert [(path, name) for path, _, name in found if (path, name) not in OTHER] == []
    assert {(path, name) for path, _, name in found} == OTHER
    # the settings the registries list are the ones the functions read their defaults from
    declared = {s.name: s for entry in POLICY_LOSSES.values() for s in entry.declared}
    assert declared["clip_range_ratio"] is losses.CLIP_RANGE_RATIO and declared["gmpo_clip_low"] is policy_losses.GMPO_CLIP_LOW
    assert declared["kl_cov_coef"] is covariance_losses.KL_COV_COEF and PREFERENCE_SETTINGS["beta"] is preference.BETA
    assert [s.default for s in (losses.CLIP_RANGE_RATIO, policy_losses.CISPO_CLIP_HIGH, covariance_losses.CLIP_COV_UB)] == [0.2, 4.0, 5.0]
    tree = ast.parse("def f(x, gamma=0.99, *, clip_range_ratio=0.2, temperature=1.0, rollout_is='none'):\n    pass")
    fake = [(n.args.args[1:] + n.args.kwonlyargs) for n in tree.body][0]
    assert [p.arg for p in fake] == ["gamma", "clip_range_ratio", "temperature", "rollout_is"]


def test_no_help_writes_out_a_choice_tuple():
    """A help that lists a field's valid names joins the tuple its check reads (`RECOMPUTE_GRANULARITIES`),
    so a new name shows in `--help` without a second edit."""
    from ppo.common.early_values import declared_choices, resolve

    lists = {" | ".join(resolve(ref)[0]) for ref, _ in declared_choices(argument_classes()).values()}
    lists = {text for text in lists if text.count(" | ") >= 2}
    assert "full | full_attn | core_attn" in lists
    modules = {base.__module__.replace(".", os.sep) + ".py" for cls in argument_classes() for base in cls.__mro__
               if base.__module__.split(".")[0] in LIBRARY}  # where the helps are written (docstrings elsewhere may list them)
    written = [(path, node.lineno, text) for path, tree in _library_trees() if path in modules for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               for text in lists if text in node.value]
    assert len(modules) > 10 and written == []
