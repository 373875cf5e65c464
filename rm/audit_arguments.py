"""Arguments of `rm/audit_reward.py` (probing a trained reward model with degenerate answers) and
of `rm/audit_cost.py` (a cost model's pairwise and sign accuracy on held-out safety pairs).

Defaults live here only; every field has a help. `validate_arguments` is the entry point's
start-up pass, run by `parse_arguments` before the model loads.
"""
from dataclasses import dataclass, field
from typing import List

from ppo.entry.argument_groups import BEAVER_TEMPLATE, DatasetArguments, shared_field
from ppo.common import validation
from ppo.common.field_bounds import ranged_field
from ppo.models.hf_import import hf_config_problems


@dataclass
class AuditArgument:
    model_name_or_path: str = field(default=None, metadata={"help": "Trained reward (score) model directory."})
    eval_datasets: List[str] = field(
        default_factory=list,
        metadata={"help": "Held-out prompts with reference answers (tgt); for a process reward model, step-labelled "
                  "records (paddlenlp-prm:1:FILE)."},
    )
    prompt_template: str = field(default=BEAVER_TEMPLATE, metadata={"help": "Prompt template with an {input} slot."})
    max_prompt_len: int = ranged_field(
        256, minimum=1, help="Prompts longer than this many tokens are dropped, not truncated (as in PPO/GRPO).")
    long_answer_tokens: int = ranged_field(32, minimum=1, help="Token count of the 'very_long' probe.")
    batch_size: int = ranged_field(64, minimum=1, help="Sequences scored per forward pass.")
    output_dir: str = field(
        default=None, metadata={"help": "Where audit.json goes (default: the model directory; only audit.json is written)."}
    )


def validate_arguments(args):
    """Every problem of a reward or cost audit run (`AuditArgument`, `CostAuditArgument`): sizes,
    the required model and held-out data, a score model."""
    problems = validation.size_problems(args)
    problems += validation.required_problems(args, ["model_name_or_path", "eval_datasets"])
    problems += validation.model_dir_problems(score_model_dirs=[("model_name_or_path", args.model_name_or_path)])
    problems += hf_config_problems([("model_name_or_path", args.model_name_or_path)])
    return problems


@dataclass
class CostAuditArgument:
    model_name_or_path: str = field(default=None, metadata={"help": "Trained cost (score) model directory."})
    eval_datasets: List[str] = field(
        default_factory=list, metadata={"help": "Held-out safety pairs (e.g. PKU-SafeRLHF/safety/test:1.0:FILE)."}
    )
    prompt_template: str = shared_field(AuditArgument, "prompt_template")
    use_chat_template: bool = shared_field(DatasetArguments, "use_chat_template")
    max_length: int = shared_field(DatasetArguments, "max_length")
    batch_size: int = shared_field(AuditArgument, "batch_size")
    output_dir: str = field(
        default=None, metadata={"help": "Where cost_audit.json goes (default: the model directory; only that file is written)."}
    )
