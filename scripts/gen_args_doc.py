"""Generate the argument reference (docs/arguments.md) from the argument dataclasses.

    python scripts/gen_args_doc.py          # rewrite the section of docs/arguments.md in place
    python scripts/gen_args_doc.py --check  # exit 1 when docs/arguments.md is out of date

The section sits between `<!-- ARGS:BEGIN -->` and `<!-- ARGS:END -->`. Fields
inherited from PaddleNLP's `TrainingArguments` are not repeated (they keep their
PaddleNLP meaning and defaults); every field the toolkit adds is listed with its
default and help.
"""
import argparse
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from ppo.common import argument_help  # noqa: E402

README = os.path.join(ROOT, "docs", "arguments.md")  # the generated reference (linked from README.md)
BEGIN, END = "<!-- ARGS:BEGIN -->", "<!-- ARGS:END -->"


def entry_points():
    from dpo import dpo_arguments as dpo
    from dpo import online_dpo_arguments as online
    from ppo import ppo_arguments as ppo
    from rm import audit_arguments as audit
    from rm import reward_arguments as rm
    from sft import sft_arguments as sft

    return [
        ("SFT — `sft/run_sft.py`", [sft.ModelArgument, sft.DataArgument, sft.SFTTrainingArguments]),
        ("Reward or cost model — `rm/run_reward.py`", [rm.ModelArgument, rm.DataArgument, rm.RewardTrainingArguments]),
        ("Reward audit — `rm/audit_reward.py`", [audit.AuditArgument]),
        ("Cost audit — `rm/audit_cost.py`", [audit.CostAuditArgument]),
        ("PPO / GRPO / RLOO / REINFORCE++ — `ppo/run_ppo.py`", [ppo.ModelArgument, ppo.DataArgument, ppo.PPOTrainingArguments]),
        ("DPO family — `dpo/run_dpo.py`", [dpo.ModelArgument, dpo.DataArgument, dpo.DPOTrainingArguments]),
        ("Online / iterative DPO — `dpo/run_online_dpo.py`",
         [online.ModelArgument, online.DataArgument, online.OnlineDPOTrainingArguments]),
    ]


def default_text(f):
    text = argument_help.default_text(f)
    return ("None" if text == "required" else text).replace("|", "\\|")


def own_fields(cls):
    inherited = argument_help.inherited_from_paddlenlp(cls)
    return [f for f in dataclasses.fields(cls) if f.init and f.name not in inherited]


def render():
    lines = []
    for title, classes in entry_points():
        lines += [f"## {title}", "", "| argument | default | meaning |", "|---|---|---|"]
        for cls in classes:
            for f in own_fields(cls):
                help_text = f.metadata.get("help", "").replace("|", "\\|")
                lines.append(f"| `{f.name}` | `{default_text(f)}` | {help_text} |")
        if any(c.__name__.endswith("TrainingArguments") for c in classes):
            lines.append("| *(all of PaddleNLP's `TrainingArguments`)* | | `output_dir`, `max_steps`, `learning_rate`, "
                         "`per_device_train_batch_size`, `sharding`, `tensor_parallel_degree`, ... |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def splice(readme_text, body):
    start, end = readme_text.index(BEGIN) + len(BEGIN), readme_text.index(END)
    return readme_text[:start] + "\n" + body + readme_text[end:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = open(README).read()
    new = splice(text, render())
    if args.check:
        if new != text:
            print("docs/arguments.md is out of date: run python scripts/gen_args_doc.py")
            return 1
        return 0
    open(README, "w").write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
