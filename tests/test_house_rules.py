"""House rules checked statically (no model, no paddle) over the whole library (`OUR_PACKAGES`):
files outside tests/ stay under 400 lines, functions under 60 lines, classes under 25 methods
counting those they inherit from our own classes, ppo/algos imports nothing of ours, the modules
import each other without cycles (imports inside functions included) and only downward through
the layers of `LAYERS`, the packages import each other without cycles, no module outside
ppo/strategy/ imports a layout folder (`LAYOUT_FOLDERS`: the entry points reach a layout through
`ppo.strategy`, `build_strategy` or `trainer_strategy`), and the trainer's parts never import
the parallel machinery (the strategy owns it). The allow-lists below are short, each entry with
its reason; a new violation fails."""
import ast
import functools
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_CLASS_METHODS = 25
MAX_ARGUMENT_BASES = 7  # an entry point's argument dataclass: groups that always travel together are one group
OUR_PACKAGES = ("ppo", "rm", "sft", "dpo", "rl", "scripts")
# Generated or table-like files allowed past MAX_FILE_LINES, by name (none today).
LONG_FILES_ALLOWED = set()
# Text files only: data, lock files and binaries are not code.
CODE_SUFFIXES = (".py", ".sh", ".md", ".cc", ".cu", ".cuh", ".h", ".txt", ".cfg", ".ini", ".toml", ".yaml", ".yml")
LAYERS = (
    ("ppo", "ppo.algos", "ppo.common", "ppo.kernels"),
    ("ppo.data", "ppo.tiny", "ppo.scoring", "ppo.scoring.registry", "ppo.verifiers", "ppo.sandbox", "ppo.judge.templates",
     "ppo.evaluation.metrics", "ppo.evaluation.early_stopping", "ppo.optimization", "ppo.serving",
     "ppo.serving.reward_client", "ppo.models.families", "ppo.models.fused_train_ops", "ppo.models.train_patch"),
    ("ppo.models",),
    ("ppo.rollout", "ppo.experience", "ppo.evaluation", "ppo.checkpoints", "ppo.agents", "ppo.tiny.kv_task", "ppo.judge",
     "ppo.scorers", "ppo.scoring.process_reward", "ppo.serving.reward_app"),
    ("ppo.passes", "ppo.strategy"),
    ("ppo.trainer",),
    ("ppo.entry", "ppo.evaluation.trainer_mixin"),
    ("ppo.run_ppo", "ppo.cli", "ppo.reward_server", "ppo.env_server", "sft", "rm", "dpo", "rl", "scripts"),
)
"""The layers of our packages, lowest first: a module imports only from its own layer (without
cycles) or lower ones. `ppo` is the package's own `__init__`; every other entry names a
package or a module with everything under it (docs/architecture.md draws them)."""

PARALLEL_MODULES = ("ppo.strategy.tensor", "ppo.strategy.pipeline", "ppo.strategy.expert", "ppo.passes.plain", "ppo.strategy.grad_sync",
                    "ppo.strategy.plain", "ppo.strategy.hybrid", "ppo.models.parallel_layers", "paddle.distributed")
"""The parallel machinery: the strategy (`ppo.strategy`) chooses and runs it."""
LAYOUT_FOLDERS = ("ppo.strategy.tensor", "ppo.strategy.pipeline", "ppo.strategy.expert")
"""The layout-specific packages (a layout or an axis): only modules under ppo/strategy/ import them;
what others need of them (the argument refusals, the `Trainer` side of a layout) `ppo.strategy`
gives."""
ENTRY_MODULES = ("ppo.run_ppo", "ppo.cli", "ppo.reward_server", "ppo.env_server")
"""The modules at the top of ppo/ besides the `SHIMS`: `python ppo/run_ppo.py`, `python ppo/reward_server.py`,
`python ppo/env_server.py` and the `paddle-align` command (setup.py)."""
PACKAGE_CYCLES_ALLOWED = {}
"""Package cycles (`package_of`) kept for now, with the reason."""
TRAINER_MODULES = ("ppo.trainer", "ppo.entry.ppo_trainer", "dpo.online_learner", "dpo.online_dpo_trainer")
"""The trainer, its updater and learners, and the builders of their runs."""


def tracked_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an unpacked copy): walk the tree
        return sorted(os.path.relpath(os.path.join(d, f), ROOT) for d, dirs, files in os.walk(ROOT)
                      if not any(p.startswith(".") for p in os.path.relpath(d, ROOT).split(os.sep) if p != ".")
                      for f in files)
    return out.stdout.split()


SHIMS = {
    "ppo.models.pipeline": "ppo.strategy.pipeline.pipe", "ppo.models.policy_pipe": "ppo.strategy.pipeline.policy_pipe",
    "ppo.models.score_model_pipe": "ppo.strategy.pipeline.score_pipe",
    "ppo.models.preference_pipe": "ppo.strategy.pipeline.preference_pipe",
    "ppo.models.reshard": "ppo.strategy.tensor.reshard", "ppo.passes.pipeline": "ppo.strategy.pipeline.passes",
    "ppo.models.tensor_parallel": "ppo.models.parallel_layers",
    "ppo.reward_client": "ppo.serving.reward_client", "ppo.ppo_arguments": "ppo.entry.ppo_arguments",
}
"""Old import paths kept for one release (`{old: new}`): re-exports only, imported by nothing
of ours, left out of the module checks (docs/architecture.md lists them)."""


@functools.lru_cache(maxsize=None)
def parsed(path):
    """The syntax tree of the file at `path`, parsed once per session (the checks only read it)."""
    with open(path) as f:
        return ast.parse(f.read())


def our_modules(with_shims=False):
    """`{dotted name: path}` of every module of OUR_PACKAGES (symlinked folders skipped; the
    `SHIMS` unless `with_shims`)."""
    mods = {}
    for pkg in OUR_PACKAGES:
        for d, dirs, files in os.walk(os.path.join(ROOT, pkg)):
            dirs[:] = sorted(x for x in dirs if not os.path.islink(os.path.join(d, x)) and x != "__pycache__")
            for f in files:
                if f.endswith(".py"):
                    parts = os.path.relpath(os.path.join(d, f), ROOT)[:-3].split(os.sep)
                    mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(d, f)
    return mods if with_shims else {k: v for k, v in mods.items() if k not in SHIMS}


def import_time_nodes(tree):
    """Import statements run when the module is imported (function bodies skipped)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def imported_modules(name, path, mods, import_time_only=True):
    """Our modules that module `name` imports (a `from pkg import sub` counts `pkg.sub`)."""
    tree = parsed(path)
    nodes = import_time_nodes(tree) if import_time_only else (n for n in ast.walk(tree)
                                                               if isinstance(n, (ast.Import, ast.ImportFrom)))

    def known(m):
        while m and m not in mods:
            m = m.rpartition(".")[0]
        return m

    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(known(a.name) for a in node.names)
            continue
        mod = node.module or ""
        if node.level:
            base = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        for a in node.names:
            found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else known(mod))
    found.discard("")
    found.discard(None)
    found.discard(name)
    return found


def strongly_connected(graph):
    """Tarjan's components of `graph` ({node: set of nodes}) with more than one node."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_long_files_outside_tests():
    long = {}
    for rel in tracked_files():
        path = os.path.join(ROOT, rel)
        if rel.startswith("tests/") or not rel.endswith(CODE_SUFFIXES) or os.path.islink(path) or not os.path.isfile(path):
            continue
        n = sum(1 for _ in open(path, errors="replace"))
        if n > MAX_FILE_LINES and rel not in LONG_FILES_ALLOWED:
            long[rel] = n
    assert not long, f"files over {MAX_FILE_LINES} lines (split them): {long}"


def installed_packages():
    """The top-level packages setup.py installs (`find_packages(include=[...])`)."""
    for node in ast.walk(parsed(os.path.join(ROOT, "setup.py"))):
        if isinstance(node, ast.keyword) and node.arg == "include":
            return {ast.literal_eval(e).split(".")[0] for e in node.value.elts}
    raise AssertionError("setup.py: no find_packages(include=[...])")


def test_the_rules_cover_every_installed_package():
    """Every package setup.py installs is library the rules check (`OUR_PACKAGES`)."""
    assert installed_packages() == set(OUR_PACKAGES) and {"ppo", "dpo", "scripts"} <= installed_packages()


def test_allowed_long_files_exist():
    """An entry of the allow-list that no longer exists is removed from it."""
    assert all(os.path.isfile(os.path.join(ROOT, f)) for f in LONG_FILES_ALLOWED), LONG_FILES_ALLOWED


def test_no_long_functions_in_the_library():
    long = []
    for name, path in sorted(our_modules().items()):
        for node in ast.walk(parsed(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_algos_imports_nothing_of_ours():
    mods = our_modules()
    bad = {name: sorted(m for m in imported_modules(name, path, mods, import_time_only=False)
                        if not m.startswith("ppo.algos"))
           for name, path in mods.items() if name.startswith("ppo.algos")}
    assert not {k: v for k, v in bad.items() if v}, bad


@functools.lru_cache(maxsize=None)
def import_graph(import_time_only=False):
    """`{module: our modules it imports}`, imports inside functions included unless `import_time_only`
    (computed once per session: callers must not change it)."""
    mods = our_modules()
    return {name: imported_modules(name, path, mods, import_time_only) for name, path in mods.items()}


def test_no_import_cycles():
    cycles = [sorted(c) for c in strongly_connected(import_graph())]
    assert not cycles, f"import cycles among our modules (imports inside functions included): {cycles}"


def layer_of(module):
    """The index in `LAYERS` of the most specific entry naming `module` (None: in no layer)."""
    best = None
    for index, layer in enumerate(LAYERS):
        for entry in layer:
            if (module == entry or module.startswith(entry + ".")) and entry != "ppo":
                if best is None or len(entry) > len(best[1]):
                    best = (index, entry)
    if best is None and module == "ppo":
        return 0
    return None if best is None else best[0]


def test_every_module_is_in_a_layer():
    unplaced = sorted(name for name in our_modules() if layer_of(name) is None)
    assert not unplaced, f"modules in no layer of LAYERS (add them where their imports put them): {unplaced}"


def test_imports_point_down_the_layers():
    upward = [f"{name} (layer {layer_of(name)}) imports {other} (layer {layer_of(other)})"
              for name, imported in sorted(import_graph().items()) for other in sorted(imported)
              if layer_of(other) is not None and layer_of(name) is not None and layer_of(other) > layer_of(name)]
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_layer_rule_finds_an_upward_import():
    assert layer_of("ppo.common.metrics") == 0 and layer_of("ppo.trainer.loop") == layer_of("ppo.trainer")
    assert layer_of("ppo.models.loading") > layer_of("ppo.data.base") and layer_of("dpo.run_dpo") == len(LAYERS) - 1
    assert layer_of("ppo") == 0 and layer_of("ppo.checkpoints.checkpoint") < layer_of("ppo.strategy") < layer_of("ppo.trainer")


def all_imports(path):
    """Every module name an import statement in `path` names (absolute, as written; relative
    ones resolved against `ppo`/`dpo`), imports inside functions included."""
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    package = rel[:-1] if rel[-1] != "__init__" else rel[:-1]
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def test_the_trainer_never_imports_the_parallel_machinery():
    """The trainer's parts reach processes and parallel layouts only through the strategy object
    they are handed (`ppo.strategy.Strategy`, its `Ranks` and passes)."""
    bad = {}
    for name, path in our_modules().items():
        if any(name == t or name.startswith(t + ".") for t in TRAINER_MODULES):
            hits = sorted(m for m in all_imports(path) if any(m == p or m.startswith(p + ".") for p in PARALLEL_MODULES))
            if hits:
                bad[name] = hits
    assert not bad, f"trainer modules importing parallel machinery: {bad}"


def test_the_parallel_rule_sees_an_import():
    mods = our_modules()
    assert "ppo.strategy.pipeline.pipe.install_last_stage_loss" in all_imports(mods["ppo.strategy.pipeline.passes"])
    assert "paddle.distributed" in all_imports(mods["ppo.strategy.ranks"]) or "paddle.distributed" in all_imports(
        mods["ppo.strategy.tensor.axis"])


def class_index(mods):
    """`({(module, class name): ClassDef}, {module: {local name: (module, name)}})` of `mods`."""
    classes, names = {}, {}
    for mod, path in mods.items():
        tree, names[mod] = parsed(path), {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[(mod, node.name)] = node
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = mod.split(".") if path.endswith("__init__.py") else mod.split(".")[:-1]
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                names[mod].update({a.asname or a.name: (base, a.name) for a in node.names})
    return classes, names


def method_names(key, classes, names, seen=()):
    """Method names of class `key` and of every base that is one of our classes (followed
    through imports and re-exports)."""
    def resolve(mod, name, hops=0):
        if (mod, name) in classes:
            return mod, name
        if hops < 5 and name in names.get(mod, {}) and names[mod][name][0] in names:
            return resolve(*names[mod][name], hops + 1)
        return None

    node = classes[key]
    found = {b.name for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for base in node.bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        parent = resolve(key[0], name) if name else None
        if parent is not None and parent not in seen and parent != key:
            found |= method_names(parent, classes, names, seen + (key,))
    return found


def test_no_class_over_the_method_limit():
    """Inherited methods count: a mixin's methods are the class's methods."""
    classes, names = class_index(our_modules())
    big = [f"{mod}.{cls} ({n} methods)" for (mod, cls) in sorted(classes)
           for n in [len(method_names((mod, cls), classes, names))] if n > MAX_CLASS_METHODS]
    assert not big, f"classes over {MAX_CLASS_METHODS} methods counting inherited ones (split them into parts): {big}"


def test_method_count_follows_our_bases():
    mods = our_modules()
    classes, names = class_index(mods)
    counted = method_names(("dpo.dpo_trainer", "DPOTrainer"), classes, names)
    assert {"generation_metrics", "_get_train_sampler", "compute_loss"} <= counted  # two mixins and its own
    assert "train" in counted and "evaluate" in counted  # StreamingTrainerMixin.train, its own evaluate


def package_of(module):
    """The package a module counts for: `ppo.trainer.loop` -> `ppo.trainer`; a loose module
    (`ppo.experience`, `dpo.run_dpo`) is its own."""
    return ".".join(module.split(".")[:2])


def package_graph():
    graph = {}
    for name, imported in import_graph().items():
        for other in imported:
            if package_of(other) != package_of(name):
                graph.setdefault(package_of(name), set()).add(package_of(other))
    return graph


def test_no_package_cycles():
    cycles = strongly_connected(package_graph())
    new = [sorted(c) for c in cycles if c not in PACKAGE_CYCLES_ALLOWED]
    assert not new, f"packages importing each other (imports inside functions included): {new}"
    assert set(PACKAGE_CYCLES_ALLOWED) <= set(cycles), "an allowed package cycle is gone: remove it from the list"


def layout_imports(modules):
    """`{module: [layout-folder modules it imports]}` of `modules` (`{name: path}`) outside ppo/strategy/."""
    found = {}
    for name, path in sorted(modules.items()):
        if name == "ppo.strategy" or name.startswith("ppo.strategy."):
            continue
        hits = sorted(m for m in all_imports(path) if any(m == f or m.startswith(f + ".") for f in LAYOUT_FOLDERS))
        if hits:
            found[name] = hits
    return found


def test_no_module_outside_the_strategy_imports_a_layout_folder():
    found = layout_imports(our_modules())
    assert not found, f"modules outside ppo/strategy/ importing a layout folder (go through ppo.strategy): {found}"


def test_package_rule_sees_a_cycle_and_a_layout_import():
    assert package_of("ppo.trainer.loop") == "ppo.trainer" and package_of("dpo.run_dpo") == "dpo.run_dpo"
    assert package_of("ppo.strategy.pipeline.pipe") == "ppo.strategy"
    assert "ppo.rollout" in package_graph()["ppo.agents"]
    mods = our_modules(with_shims=True)  # the old import paths re-export the layout folders' modules
    assert "ppo.strategy.pipeline.pipe" in layout_imports({"ppo.models.pipeline": mods["ppo.models.pipeline"]})[
        "ppo.models.pipeline"]


def test_fleet_private_pipeline_attributes_have_one_writer():
    """fleet's and PaddleNLP's `_loss_fn` / `_prepare_pipeline_inputs_func` are set only by
    `ppo.strategy.pipeline.pipe.install_last_stage_loss`."""
    writers = []
    for name, path in sorted(our_modules().items()):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef) and node.name != "install_last_stage_loss":
                for sub in ast.walk(node):
                    targets = sub.targets if isinstance(sub, ast.Assign) else []
                    if any(isinstance(t, ast.Attribute) and t.attr in ("_loss_fn", "_prepare_pipeline_inputs_func")
                           for t in targets):
                        writers.append(f"{name}.{node.name}")
    assert not writers, writers


def test_cycle_finder_finds_a_cycle():
    """The checks above can fail: a planted cycle and a relative import are seen."""
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    mods = our_modules()
    assert "ppo.data.base" in imported_modules("ppo.data.tokenized", mods["ppo.data.tokenized"], mods)
    assert "ppo.trainer.updater" in import_graph()["ppo.entry.ppo_trainer"]




def test_shims_only_re_export_warn_and_nothing_of_ours_imports_them():
    """A shim is its docstring, `import warnings`, re-exports of the new module and one
    `DeprecationWarning` naming the new path."""
    mods = our_modules(with_shims=True)
    for old, new in SHIMS.items():
        tree = parsed(mods[old])
        assert new in mods and all(isinstance(n, (ast.Expr, ast.Import, ast.ImportFrom)) for n in tree.body), old
        assert all(a.name == "warnings" for n in tree.body if isinstance(n, ast.Import) for a in n.names), old
        warns = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
        assert len(warns) == 1 and ast.unparse(warns[0].func) == "warnings.warn", old
        assert "DeprecationWarning" in ast.unparse(warns[0]) and new in ast.unparse(warns[0]), old
    users = {name: sorted(set(SHIMS) & imported) for name, imported in import_graph().items()}
    assert not {k: v for k, v in users.items() if v}, users


def test_the_top_of_ppo_holds_entry_points_shims_and_packages_only():
    """ppo/*.py: the package's `__init__`, the entry points users run, and the `SHIMS`."""
    loose = {name for name in our_modules(with_shims=True) if name.count(".") == 1 and name.startswith("ppo.")
             and not os.path.isdir(os.path.join(ROOT, *name.split(".")))}
    assert loose - set(SHIMS) == set(ENTRY_MODULES), sorted(loose - set(SHIMS))


MAX_POSITIONAL = 6
LOOP_PARTS = {"ppo.trainer.loop": "OnlineLoop", "ppo.rollout.engine": "RolloutEngine",
              "ppo.trainer.agent_rollout": "TrajectoryRollout", "ppo.trainer.evaluator": "Evaluator",
              "ppo.trainer.rollout": "Rollout", "ppo.trainer.updater": "PPOUpdater",
              "ppo.trainer.advantages": "AdvantageStage", "ppo.trainer.run_state": "RunState",
              "dpo.online_learner": "OnlineDPOLearner", "ppo.trainer.experience_maker": "ExperienceMaker",
              "ppo.trainer.remote_rollout": "RemoteRollout", "ppo.passes.plain": "PlainPasses",
              "ppo.strategy.pipeline.passes": "PipelinePasses", "ppo.agents.rollout": "AgentRollout",
              "ppo.rollout.multi_turn": "SlotDecoder"}
"""The online loop's parts that the run builders wire: their constructors take the rest by keyword."""


def positional_parameters(path, cls):
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            init = next(b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__")
            return [a.arg for a in init.args.posonlyargs + init.args.args][1:]
    raise AssertionError(f"{cls} not found in {path}")


def test_loop_parts_take_at_most_six_positional_arguments():
    mods = our_modules()
    wide = {cls: len(params) for mod, cls in LOOP_PARTS.items()
            for params in [positional_parameters(mods[mod], cls)] if len(params) > MAX_POSITIONAL}
    assert not wide, f"constructors with more than {MAX_POSITIONAL} positional parameters (make the rest keyword-only): {wide}"


def test_callers_pass_loop_parts_by_keyword_past_six():
    """No call of a loop part gives more positional arguments than it takes (a `*parts` call counts as wide)."""
    wide = []
    for name, path in sorted(our_modules().items()):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in LOOP_PARTS.values():
                if len(node.args) > MAX_POSITIONAL or any(isinstance(a, ast.Starred) for a in node.args):
                    wide.append(f"{name}:{node.lineno}")
    assert not wide, wide


def wide_argument_classes(classes):
    """`module.Class (n bases)` of each class of `classes` with more than MAX_ARGUMENT_BASES bases."""
    return [f"{cls.__module__}.{cls.__qualname__} ({len(cls.__bases__)} bases)" for cls in classes
            if len(cls.__bases__) > MAX_ARGUMENT_BASES]


def test_no_entry_argument_dataclass_has_more_than_seven_bases():
    """Every argument dataclass of every entry point (`ppo.common.entry_points`) takes at most
    MAX_ARGUMENT_BASES groups as its bases."""
    from ppo.common.argument_table import import_classes
    from ppo.common.entry_points import ENTRY_POINTS
    from ppo.entry.ppo_arguments import PPOTrainingArguments

    classes = {cls for entry in ENTRY_POINTS for cls in import_classes(entry)}
    assert PPOTrainingArguments in classes and len(classes) >= 15
    assert not wide_argument_classes(classes), wide_argument_classes(classes)
    wide = type("Wide", tuple(type(f"Group{i}", (), {}) for i in range(MAX_ARGUMENT_BASES + 1)), {})
    assert wide_argument_classes([wide]) == [f"{__name__}.Wide ({MAX_ARGUMENT_BASES + 1} bases)"]
