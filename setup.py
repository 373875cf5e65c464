"""Install the alignment toolkit (the `ppo` library with its algos, data and models, the `sft`,
`rm`, `dpo` and `rl` entry points, the `scripts`) and the `paddle-align` command.

`pip install -e .` (scripts/setup.sh runs it) makes the packages importable from anywhere and
puts `paddle-align` on PATH: one command per entry point (`paddle-align ppo config.json`,
`paddle-align sft ...`, `paddle-align reward-server`; `paddle-align --help` lists them,
`ppo/common/entry_points.py` holds the table), each running its script from the checkout. The
scripts (`python ppo/run_ppo.py`, `python sft/run_sft.py`, ...) import the installed packages
and never edit `sys.path`: run them from the checkout that is installed (or put another
checkout first with `PYTHONPATH`, as the test suite does for the scripts it starts). The custom
CPU/CUDA ops in `csrc/` are built separately by `csrc/build_ops.py` (called by the README set-up
commands); without them the rollout engine falls back to pure Paddle and says so once.
"""
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent


def read_requirements(name):
    lines = (ROOT / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith(("#", "-r"))]


setup(
    name="paddle-align",
    version="0.1.0",
    description="PaddlePaddle-native LLM alignment toolkit: SFT, reward models, PPO, GRPO, DPO family",
    long_description=(ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ppo", "ppo.*", "sft", "rm", "dpo", "rl", "scripts"]),
    package_data={"ppo.common": ["argument_table.json"]},  # --help and argument errors before Paddle loads
    entry_points={"console_scripts": ["paddle-align=ppo.cli:main"]},
    python_requires=">=3.9",
    install_requires=read_requirements("requirements.txt"),
    extras_require={
        "dev": ["pytest"],
        # report_to wandb / tensorboard; PaddleNLP's Trainer (SFT, RM, DPO) writes TensorBoard with tensorboardX
        "wandb": ["wandb"],
        "tensorboard": ["tensorboard", "tensorboardX"],
    },
)
