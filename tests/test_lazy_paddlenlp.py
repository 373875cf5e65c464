"""PaddleNLP's unused subpackages run on first use (`ppo.common.lazy_paddlenlp`): each check
runs in a fresh interpreter, since the deferral has to happen before PaddleNLP is imported."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("sklearn", "seqeval", "scipy.stats", "paddlenlp.taskflow.taskflow")


def fresh(code, **env):
    """Run `code` in a new interpreter (repository root on the path); returns its last stdout line as JSON."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT, **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


LOADED = "[m for m in %r if m in sys.modules]" % (HEAVY,)


@pytest.mark.slow
def test_entry_points_start_without_the_deferred_packages_and_load_them_on_first_use():
    out = fresh(
        "import json, sys\n"
        "import ppo\n"
        "assert not [m for m in sys.modules if m.startswith('paddlenlp')]  # nothing registered before PaddleNLP's import\n"
        "import ppo.run_ppo, sft.run_sft, dpo.run_dpo, rm.run_reward\n"
        f"before = {LOADED}\n"
        "from paddlenlp.metrics import ChunkEvaluator\n"
        "import paddlenlp.trainer.trainer_compress as compress\n"
        "made = compress.ChunkEvaluator(label_list=['B-X', 'I-X', 'O'])\n"
        "print(json.dumps({'before': before, 'class': isinstance(ChunkEvaluator, type), 'made': type(made) is ChunkEvaluator,"
        f" 'after': {LOADED}}}))"
    )
    assert out["before"] == []
    assert out["class"] and out["made"]  # the real class after first use; the stand-in bound at import forwards to it
    assert "sklearn" in out["after"] and "seqeval" in out["after"]


@pytest.mark.slow
def test_eager_switch_and_other_versions_leave_the_import_alone():
    eager = fresh(f"import json, sys\nimport ppo, paddlenlp\nprint(json.dumps({LOADED}))", PPO_EAGER_PADDLENLP="1")
    assert "sklearn" in eager and "paddlenlp.taskflow.taskflow" in eager
    other = fresh(
        "import json, sys\nimport ppo.common.lazy_paddlenlp as lazy\n"
        "sys.modules.pop('paddlenlp.metrics', None)\n"
        "lazy._installed_version = lambda: '9.9'\n"
        "print(json.dumps(lazy.defer_unused_packages()))"
    )
    assert other == []
