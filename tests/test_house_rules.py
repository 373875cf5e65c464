"""House rules checked statically (no model, no paddle): files outside tests/ stay under 400
lines, functions in ppo/ under 60 lines and classes under 25 methods, ppo/algos imports nothing
of ours, the modules of our packages import each other without cycles (imports inside
functions included) and only downward through the layers of `LAYERS`, and the trainer's parts
never import the parallel machinery (the strategy owns it)."""
import ast
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_CLASS_METHODS = 25
OUR_PACKAGES = ("ppo", "rm", "sft", "dpo", "rl")
# Generated or table-like files allowed past MAX_FILE_LINES, by name (none today).
LONG_FILES_ALLOWED = set()
# Text files only: data, lock files and binaries are not code.
CODE_SUFFIXES = (".py", ".sh", ".md", ".cc", ".cu", ".cuh", ".h", ".txt", ".cfg", ".ini", ".toml", ".yaml", ".yml")
LAYERS = (
    ("ppo", "ppo.algos", "ppo.common", "ppo.kernels"),
    ("ppo.data", "ppo.tiny", "ppo.scoring", "ppo.scoring.registry", "ppo.verifiers", "ppo.sandbox", "ppo.judge.templates",
     "ppo.evaluation.metrics", "ppo.evaluation.early_stopping", "ppo.optimization", "ppo.serving",
     "ppo.serving.reward_client", "ppo.models.families", "ppo.models.fused_train_ops", "ppo.models.train_patch",
     "ppo.strategy.tensor.reshard"),
    ("ppo.models",),
    ("ppo.rollout", "ppo.experience", "ppo.evaluation", "ppo.checkpoints", "ppo.agents", "ppo.tiny.kv_task", "ppo.judge",
     "ppo.scorers", "ppo.scoring.process_reward", "ppo.serving.reward_app"),
    ("ppo.passes", "ppo.strategy"),
    ("ppo.trainer",),
    ("ppo.entry", "ppo.evaluation.trainer_mixin", "ppo.ppo_argument_checks", "ppo.ppo_arguments",
     "ppo.paddlenlp_rl_arguments", "ppo.ppo_trainer"),
    ("ppo.run_ppo", "ppo.cli", "ppo.reward_server", "ppo.env_server", "sft", "rm", "dpo", "rl"),
)
"""The layers of our packages, lowest first: a module imports only from its own layer (without
cycles) or lower ones. `ppo` is the package's own `__init__`; every other entry names a
package or a module with everything under it (docs/architecture.md draws them)."""

PARALLEL_MODULES = ("ppo.strategy.tensor", "ppo.strategy.pipeline", "ppo.passes.plain", "ppo.strategy.grad_sync",
                    "ppo.strategy.plain", "ppo.strategy.hybrid", "ppo.models.parallel_layers", "paddle.distributed")
"""The parallel machinery: the strategy (`ppo.strategy`) chooses and runs it."""
TRAINER_MODULES = ("ppo.trainer", "ppo.ppo_trainer", "dpo.online_learner", "dpo.online_dpo_trainer")
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
    "ppo.scorer_registry": "ppo.scoring.registry", "ppo.reward_client": "ppo.serving.reward_client",
    "ppo.process_reward_scorer": "ppo.scoring.process_reward", "ppo.eval_metrics": "ppo.evaluation.metrics",
    "ppo.checkpoint": "ppo.checkpoints.checkpoint", "ppo.resume_check": "ppo.checkpoints.resume_check",
    "ppo.sampled_eval": "ppo.evaluation.sampled", "ppo.early_stopping": "ppo.evaluation.early_stopping",
    "ppo.offload": "ppo.optimization.offload", "ppo.optim": "ppo.optimization.optim",
    "ppo.prompt_sampler": "ppo.data.prompt_sampler",
}
"""Old import paths kept for one release (`{old: new}`): re-exports only, imported by nothing
of ours, left out of the module checks (docs/architecture.md lists them)."""


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
    tree = ast.parse(open(path).read())
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


def test_allowed_long_files_exist():
    """An entry of the allow-list that no longer exists is removed from it."""
    assert all(os.path.isfile(os.path.join(ROOT, f)) for f in LONG_FILES_ALLOWED), LONG_FILES_ALLOWED


def test_no_long_functions_in_ppo():
    long = []
    for name, path in sorted(our_modules().items()):
        if not name.startswith("ppo"):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines in ppo/: {long}"


def test_algos_imports_nothing_of_ours():
    mods = our_modules()
    bad = {name: sorted(m for m in imported_modules(name, path, mods, import_time_only=False)
                        if not m.startswith("ppo.algos"))
           for name, path in mods.items() if name.startswith("ppo.algos")}
    assert not {k: v for k, v in bad.items() if v}, bad


def import_graph(import_time_only=False):
    """`{module: our modules it imports}`, imports inside functions included unless `import_time_only`."""
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
    for node in ast.walk(ast.parse(open(path).read())):
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


def test_no_class_over_the_method_limit():
    big = []
    for name, path in sorted(our_modules().items()):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ClassDef):
                n = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                if n > MAX_CLASS_METHODS:
                    big.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({n} methods)")
    assert not big, f"classes over {MAX_CLASS_METHODS} methods (split them into parts): {big}"


def test_fleet_private_pipeline_attributes_have_one_writer():
    """fleet's and PaddleNLP's `_loss_fn` / `_prepare_pipeline_inputs_func` are set only by
    `ppo.strategy.pipeline.pipe.install_last_stage_loss`."""
    writers = []
    for name, path in sorted(our_modules().items()):
        for node in ast.walk(ast.parse(open(path).read())):
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
    assert "ppo.trainer.updater" in import_graph()["ppo.ppo_trainer"]




def test_shims_only_re_export_and_nothing_of_ours_imports_them():
    mods = our_modules(with_shims=True)
    for old, new in SHIMS.items():
        tree = ast.parse(open(mods[old]).read())
        assert new in mods and all(isinstance(n, (ast.Expr, ast.ImportFrom)) for n in tree.body), old
    users = {name: sorted(set(SHIMS) & imported) for name, imported in import_graph().items()}
    assert not {k: v for k, v in users.items() if v}, users
