"""Shared pytest set-up: the repository root on sys.path, and first on PYTHONPATH for the
processes the tests start (the entry scripts import the installed packages: whatever checkout
the environment's `pip install -e .` points at, a test runs this one's), and the fast-MKL setting
applied before paddle is imported (MKL_DEBUG_CPU_TYPE=5: 3-4x faster matmuls on AVX2-only AMD
CPUs)."""
import os
import sys

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
os.environ.setdefault("FLAGS_call_stack_level", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != ROOT:
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

import pytest  # noqa: E402

SUMMARY_PROPERTY = "print_in_summary"
"""A test's `record_property(SUMMARY_PROPERTY, text)` prints `text` at the end of the run, passed or
failed (captured output is shown only for failures, and pytest-xdist workers' output not at all)."""


LONGEST_FILES_FIRST = (
    "test_real_shapes_pipeline.py", "test_demo_quality.py", "test_tensor_parallel.py", "test_cold_launch.py",
    "test_parallel_accuracy.py",
    "test_data_tensor_parallel.py",
    "test_data_parallel.py", "test_pipeline_entry.py", "test_pipeline_rl.py", "test_cost_model.py", "test_cuda_compile.py",
    "test_random_kills.py", "test_batch_knobs.py", "test_pipeline_models.py", "test_ppo_trainer.py", "test_lora_rlhf.py",
    "test_grpo.py", "test_real_shapes_rollout.py", "test_engine_tensor_parallel.py",
)
"""Test files by the seconds their tests took in CI (the default and the slow suite), longest first.
pytest-xdist hands whole files to its workers in collection order (pytest.ini:
`--no-loadscope-reorder`): starting the longest first keeps one worker from finishing a long file
alone at the end (the slow suite's two longest runs had landed on one worker: 838 s instead of
about 600); the real-shape runs, five shapes of five stages (about 40 minutes alone), start first.
`test_parallel_accuracy.py` comes after the real-shape runs and the cold launches (slow
suite, about 110 s): by then the demo guard has trained the SFT and reward models it shares
(`tests/shared_demo.py`)."""


def pytest_collection_modifyitems(items):
    """Put the files of `LONGEST_FILES_FIRST` first, in its order; the rest keep theirs."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_terminal_summary(terminalreporter):
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            for name, text in getattr(report, "user_properties", []):
                if name == SUMMARY_PROPERTY:
                    terminalreporter.write_sep("-", f"{report.nodeid} ({outcome})")
                    terminalreporter.write_line(str(text))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 1-layer, 32-hidden Llama and its tokenizer, built once per test session."""
    from ppo.tiny.factory import build_tiny

    path = str(tmp_path_factory.mktemp("tiny_model"))
    build_tiny(path, seed=11, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return path


def save_score_model(base_dir, path, seed=5):
    """A score model on `base_dir`'s causal LM (random head, seed `seed`) with its tokenizer, saved in `path`."""
    import paddle

    from ppo.models.loading import load_tokenizer
    from ppo.models.score_model import AutoModelForScore

    paddle.seed(seed)
    AutoModelForScore.from_pretrained(base_dir).save_pretrained(path)
    load_tokenizer(base_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_rm_dir(tiny_model_dir, tmp_path_factory):
    """A score model on the tiny Llama (random head, seed 5) with its tokenizer."""
    return save_score_model(tiny_model_dir, str(tmp_path_factory.mktemp("tiny_rm")))


@pytest.fixture(scope="session")
def tiny_rm_dir_cost(tiny_model_dir, tmp_path_factory):
    """A random score model on the tiny Llama (head seed 9) used as a cost model: costs vary by response."""
    return save_score_model(tiny_model_dir, str(tmp_path_factory.mktemp("random_cost")), seed=9)


@pytest.fixture(scope="session")
def two_layer_model_dir(tmp_path_factory):
    """The tiny Llama with 2 layers: each stage of a pipeline_parallel_degree 2 run gets one."""
    from ppo.tiny.factory import build_tiny

    path = str(tmp_path_factory.mktemp("two_layer_model"))
    build_tiny(path, seed=11, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return path


@pytest.fixture(scope="session")
def two_layer_score_dir(two_layer_model_dir, tmp_path_factory):
    """A score model on the 2-layer Llama (score head seed 5): runs compared start from the same head."""
    return save_score_model(two_layer_model_dir, str(tmp_path_factory.mktemp("two_layer_score")))


@pytest.fixture(scope="session")
def two_layer_cost_dir(two_layer_model_dir, tmp_path_factory):
    """A score model on the 2-layer Llama (head seed 9) used as a cost model: costs vary by response."""
    return save_score_model(two_layer_model_dir, str(tmp_path_factory.mktemp("two_layer_cost")), seed=9)


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory):
    """A small copy of the demo task data (all splits)."""
    from ppo.tiny import demo_data

    path = str(tmp_path_factory.mktemp("tiny_data"))
    # wrong_symbol_frac 0: the pairs the seed-sensitive tests here were set on (the demo's default adds them)
    demo_data.generate(path, seed=3, num_sft=256, num_preference=128, num_preference_eval=32, num_prompts=128, num_test=32,
                       wrong_symbol_frac=0.0)
    return path


def pytest_sessionfinish(session):
    """Stops the zygotes of tests/warm_python.py (started by the first test running an entry script)."""
    warm_python = sys.modules.get("tests.warm_python")
    if warm_python is not None:
        warm_python.stop_all()
