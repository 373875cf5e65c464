"""The demo's SFT model and reward model, trained once per test run and shared by the slow
tests that need them (the demo guard runs the whole quickstart; the TP/PP accuracy test starts
its PPO runs from the same two models).

Under pytest-xdist the test processes share the run's temporary root; a file lock makes the
first test that asks run `scripts/quickstart.py --stop-after rm` there, and the others wait for
it and then find those stages done (the quickstart skips stages with a done marker)."""
import os

from filelock import FileLock

from scripts import quickstart


def demo_root(tmp_path_factory):
    """The output root of the quickstart shared by this test run's processes."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # each worker's basetemp is a folder of the run's shared one
    return str(base / "demo_quickstart")


def demo_through_reward_model(tmp_path_factory):
    """The shared root with the quickstart's build, SFT and reward-model stages done."""
    root = demo_root(tmp_path_factory)
    with FileLock(root + ".lock"):
        quickstart.main(["--output_root", root, "--stop-after", "rm"])
    return root
