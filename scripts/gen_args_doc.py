"""Generate the argument reference (docs/arguments.md; PPO/GRPO's in docs/arguments_rl.md) and the
stored argument table of `--help` (ppo/common/argument_table.json) from the argument dataclasses.

    python scripts/gen_args_doc.py          # rewrite them in place
    python scripts/gen_args_doc.py --check  # exit 1 when any is out of date

Each page's section sits between `<!-- ARGS:BEGIN -->` and `<!-- ARGS:END -->`. Fields
inherited from PaddleNLP's `TrainingArguments` are not repeated (they keep their
PaddleNLP meaning and defaults); every field the toolkit adds is listed with its
default and help; a field generated from a registry entry's `ppo.algos.Setting` names the entries
that read it. The entry points and their dataclasses come from
`ppo/common/entry_points.py`.
"""
import argparse
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from ppo.common import argument_help, argument_table  # noqa: E402
from ppo.common.registry_settings import declarations_of  # noqa: E402
from ppo.common.entry_points import entry_point  # noqa: E402

README = os.path.join(ROOT, "docs", "arguments.md")  # the generated reference (linked from README.md)
RL_PAGE = os.path.join(ROOT, "docs", "arguments_rl.md")  # PPO / GRPO's arguments, the longest list
BEGIN, END = "<!-- ARGS:BEGIN -->", "<!-- ARGS:END -->"

TITLES = {  # command -> its section title in docs/arguments.md (kto shares dpo's arguments)
    "sft": "SFT — `sft/run_sft.py`",
    "reward": "Reward or cost model — `rm/run_reward.py`",
    "audit-reward": "Reward audit — `rm/audit_reward.py`",
    "audit-cost": "Cost audit — `rm/audit_cost.py`",
    "ppo": "PPO / GRPO / RLOO / REINFORCE++ — `ppo/run_ppo.py`",
    "dpo": "DPO family — `dpo/run_dpo.py`",
    "online-dpo": "Online / iterative DPO — `dpo/run_online_dpo.py`",
    "distill": "On-policy distillation (GKD) — `sft/run_distill.py`",
}


PAGES = {README: [c for c in TITLES if c != "ppo"], RL_PAGE: ["ppo"]}
"""Each generated page and the commands whose arguments it lists."""


def entry_points(commands=tuple(TITLES)):
    return [(TITLES[command], argument_table.import_classes(entry_point(command))) for command in commands]


def default_text(f):
    text = argument_help.default_text(f)
    return ("None" if text == "required" else text).replace("|", "\\|")


def own_fields(cls):
    inherited = argument_help.inherited_from_paddlenlp(cls)
    return [f for f in dataclasses.fields(cls) if f.init and f.name not in inherited]


def render(commands=tuple(TITLES)):
    lines = []
    for title, classes in entry_points(commands):
        lines += [f"## {title}", "", "| argument | default | meaning |", "|---|---|---|"]
        declared = declarations_of(classes)
        for cls in classes:
            for f in own_fields(cls):
                help_text = f.metadata.get("help", "").replace("|", "\\|")
                if f.name in declared:  # a registry entry's setting: the row comes from its declaration
                    help_text += f" *(a setting of {declared[f.name][2]}, declared beside it)*"
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
    parser = argparse.ArgumentParser(description=argument_help.doc_summary(__doc__))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    pages = {path: open(path).read() for path in PAGES}
    fresh = {path: splice(text, render(PAGES[path])) for path, text in pages.items()}
    table = argument_table.table_text(argument_table.build_table())
    with open(argument_table.TABLE_PATH, encoding="utf-8") if os.path.exists(argument_table.TABLE_PATH) else open(os.devnull) as f:
        stored = f.read()
    if args.check:
        stale = [os.path.relpath(path, ROOT) for path in PAGES if fresh[path] != pages[path]]
        stale += ["ppo/common/argument_table.json"] if table != stored else []
        if stale:
            print(f"{' and '.join(stale)} out of date: run python scripts/gen_args_doc.py")
            return 1
        return 0
    for path, text in fresh.items():
        open(path, "w").write(text)
    with open(argument_table.TABLE_PATH, "w", encoding="utf-8") as f:
        f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
