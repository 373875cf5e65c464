"""The toolkit's entry points: one table that the installed `paddle-align` command
(`ppo/cli.py`), the stored argument table of `--help` (`ppo/common/argument_table.py`) and the
argument reference (`scripts/gen_args_doc.py`) read.

Each entry names its script (run as `python <script> ...` from a checkout, or
`paddle-align <command> ...` once installed with `pip install -e .`) and, for the scripts that
read a flat JSON/YAML argument file, the argument dataclasses as `module:Class` (imported only
by the code that builds the stored table, never while starting). Importing this module imports
nothing else.
"""
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class EntryPoint:
    command: str
    """`paddle-align <command>`."""
    script: str
    """The script, from the repository root."""
    summary: str
    """One line for `paddle-align --help`."""
    arguments: Tuple[str, ...] = ()
    """`module:Class` of the argument dataclasses, in parsing order; empty for the scripts with a
    small argparse command line of their own."""
    aliases: Tuple[str, ...] = ()
    """Other commands that run the same script."""


def _classes(module, *names):
    return tuple(f"{module}:{name}" for name in names)


ENTRY_POINTS = (
    EntryPoint("sft", "sft/run_sft.py", "supervised fine-tuning, full or LoRA",
               _classes("sft.sft_arguments", "ModelArgument", "DataArgument", "SFTTrainingArguments")),
    EntryPoint("reward", "rm/run_reward.py", "reward-model (or Safe RLHF cost-model) training",
               _classes("rm.reward_arguments", "ModelArgument", "DataArgument", "RewardTrainingArguments"), ("rm",)),
    EntryPoint("audit-reward", "rm/audit_reward.py", "probe a reward model with degenerate answers",
               _classes("rm.audit_arguments", "AuditArgument")),
    EntryPoint("audit-cost", "rm/audit_cost.py", "a cost model's accuracy on held-out safety pairs",
               _classes("rm.audit_arguments", "CostAuditArgument")),
    EntryPoint("ppo", "ppo/run_ppo.py", "PPO, GRPO, RLOO, REINFORCE++ (adv_estimator picks; PPO-Lagrangian with a cost model)",
               _classes("ppo.entry.ppo_arguments", "ModelArgument", "DataArgument", "PPOTrainingArguments"), ("grpo",)),
    EntryPoint("rl", "rl/run_rl.py", "PaddleNLP's run_rl.py: the ppo entry reading rl_algorithm (ppo, grpo, "
               "reinforce_plus_plus, rloo, vapo) from PaddleNLP's rl/ YAML files",
               _classes("ppo.entry.ppo_arguments", "ModelArgument", "DataArgument", "PPOTrainingArguments")),
    EntryPoint("dpo", "dpo/run_dpo.py", "DPO and the preference-loss family (loss_type picks)",
               _classes("dpo.dpo_arguments", "ModelArgument", "DataArgument", "DPOTrainingArguments")),
    EntryPoint("kto", "dpo/run_kto.py", "dpo with loss_type kto by default (PaddleNLP's kto_argument.json)",
               _classes("dpo.dpo_arguments", "ModelArgument", "DataArgument") + ("dpo.run_kto:KTOTrainingArguments",)),
    EntryPoint("online-dpo", "dpo/run_online_dpo.py", "online (iterative) DPO on pairs sampled from the policy",
               _classes("dpo.online_dpo_arguments", "ModelArgument", "DataArgument", "OnlineDPOTrainingArguments")),
    EntryPoint("distill", "sft/run_distill.py", "on-policy distillation (GKD) from a teacher, full or LoRA student",
               _classes("sft.distill_arguments", "ModelArgument", "DataArgument", "DistillTrainingArguments")),
    EntryPoint("reward-server", "ppo/reward_server.py", "the HTTP reward server GRPO scores with"),
    EntryPoint("env-server", "ppo/env_server.py", "an environment served over HTTP for env_name remote"),
    EntryPoint("merge-lora", "sft/merge_lora.py", "merge a LoRA adapter into its base model"),
    EntryPoint("quickstart", "scripts/quickstart.py", "the tiny CPU pipeline, end to end, and its results table"),
    EntryPoint("chat", "scripts/chat.py", "answers to prompts from a trained policy or LoRA adapter, by the rollout engine"),
    EntryPoint("plot-metrics", "scripts/plot_metrics.py", "training curves of runs (metrics.jsonl) to PNG"),
)


def entry_point(command):
    """The entry point run by `paddle-align <command>` (a command or an alias); None when none is."""
    for entry in ENTRY_POINTS:
        if command == entry.command or command in entry.aliases:
            return entry
    return None

