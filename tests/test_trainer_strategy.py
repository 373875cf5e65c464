"""The PPO trainer (ppo/entry/ppo_trainer.py and ppo/trainer/) does not know the parallel strategy:
every pass through a model goes through `ModelPasses` (ppo/passes/), picked once by
`build_model_passes`. Nor do the PaddleNLP-`Trainer` subclasses of SFT, the reward models and the
offline DPO family (sft/, rm/, dpo/ `*_trainer.py`): what differs per layout is a hook of their
`TrainerLayout` (`prediction_step`, `pair_end_scores`, `preference_run`). Checked on the source:
no trainer names the pipeline machinery or a parallel degree, and no condition of it tests
anything that names a strategy."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER_FILES = ["ppo/entry/ppo_trainer.py"] + sorted(
    f"ppo/trainer/{name}" for name in os.listdir(os.path.join(ROOT, "ppo", "trainer")) if name.endswith(".py"))
# the PaddleNLP-Trainer subclasses, their mixins and their run's setup and final save (online DPO's
# builder refuses a launch of several processes: not a layout path; trainer_resume.py asks where
# PaddleNLP's sharded checkpoint format keeps the optimiser states)
ENTRY_TRAINER_FILES = sorted(f"{folder}/{name}" for folder in ("sft", "rm", "dpo")
                             for name in os.listdir(os.path.join(ROOT, folder))
                             if name.endswith("_trainer.py") and name != "online_dpo_trainer.py") + [
    "ppo/entry/moe_aux_trainer.py", "ppo/entry/run_setup.py", "ppo/entry/streaming_trainer.py",
    "ppo/entry/trainer_callbacks.py", "ppo/evaluation/trainer_mixin.py"]

# names that only code choosing or running a strategy needs
STRATEGY_NAMES = {
    "pipes", "pp_degree", "pipeline_parallel_degree", "tensor_parallel_degree", "sharding_parallel_degree",
    "sep_parallel_degree", "use_hybrid_parallel", "PipelinePasses", "PlainPasses", "PipelineLayer",
    "PipelineParallel", "fleet", "policy_pipe", "score_model_pipe", "DataParallel",
}
STRATEGY_WORD = re.compile(r"pipe|parallel|sharding|hybrid|fleet|strategy|degree", re.I)


def names_in(node):
    """Every identifier `node` mentions: names, attributes, imported modules and names."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr
        elif isinstance(sub, ast.ImportFrom):
            yield from (sub.module or "").split(".")
            yield from (alias.name for alias in sub.names)
        elif isinstance(sub, ast.Import):
            for alias in sub.names:
                yield from alias.name.split(".")


def strategy_problems(source, filename="<source>"):
    """`file:line: what` for each strategy name the code uses and each branch on one."""
    tree = ast.parse(source, filename)
    problems = [f"{filename}:{getattr(node, 'lineno', '?')}: names {name}"
                for node in ast.walk(tree) if isinstance(node, (ast.Name, ast.Attribute, ast.Import, ast.ImportFrom))
                for name in names_in(node) if name in STRATEGY_NAMES]
    for node in ast.walk(tree):
        tests = []
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        for test in tests:
            words = sorted({name for name in names_in(test) if STRATEGY_WORD.search(name)})
            if words:
                problems.append(f"{filename}:{node.lineno if hasattr(node, 'lineno') else test.lineno}: branches on {words}")
    return list(dict.fromkeys(problems))


@pytest.mark.parametrize("snippet, found", [
    ("if args.pipeline_parallel_degree > 1:\n    x = 1\n", "names pipeline_parallel_degree"),
    ("y = a if self.passes.is_pipeline else b\n", "branches on ['is_pipeline']"),
    ("from ..passes.pipeline import PipelinePasses\n", "names PipelinePasses"),
    ("if isinstance(model, fleet.meta_parallel.PipelineLayer):\n    pass\n", "names PipelineLayer"),
    ("rows = [r for r in rows if r.stage == self.pp_degree]\n", "names pp_degree"),
    ("if self.args.use_hybrid_parallel:\n    pass\n", "names use_hybrid_parallel"),
    # what SFT's and DPO's Trainer subclasses did before their layout's hooks took it
    ("if self.args.pipeline_parallel_degree > 1:\n    return super().prediction_step(model, inputs, False)\n",
     "branches on ['pipeline_parallel_degree']"),
    ("loss = self.pipeline_run.loss(x) if self.pipeline_run is not None else self.loss(model, x)\n",
     "branches on ['pipeline_run']"),
    ("strategy.save_trainer_model(trainer, out, merge_tensor_parallel=args.tensor_parallel_degree > 1)\n",
     "names tensor_parallel_degree"),
])
def test_the_check_finds_strategy_branches(snippet, found):
    assert any(found in problem for problem in strategy_problems(snippet)), strategy_problems(snippet)


def test_the_check_passes_strategy_free_code():
    assert strategy_problems("with self.generation_weights() as model:\n    out = self.passes.values(model, exp)\n") == []


def test_the_trainer_never_branches_on_the_parallel_strategy():
    assert len(TRAINER_FILES) >= 4  # ppo_trainer.py, experience_maker.py, loop.py, update.py (+ __init__.py)
    problems = []
    for name in TRAINER_FILES:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            problems += strategy_problems(f.read(), name)
    assert not problems, "\n".join(problems)


def test_the_paddlenlp_trainers_never_branch_on_the_parallel_layout():
    assert {"sft/sft_trainer.py", "rm/reward_trainer.py", "dpo/dpo_trainer.py"} <= set(ENTRY_TRAINER_FILES)
    problems = []
    for name in ENTRY_TRAINER_FILES:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            problems += strategy_problems(f.read(), name)
    assert not problems, "\n".join(problems)
