"""Arguments of `sft/run_distill.py` (on-policy distillation, GKD; full or LoRA student).

Defaults live here (TRL's `GKDConfig` defaults: `lmbda`, and `beta` as the loss's `GKD_BETA`); every
field has a help. `validate_arguments` is the entry point's start-up pass, run before any model loads;
`tokenizer_problems` compares the student's and the teacher's tokenizers there too.
"""
from dataclasses import dataclass, field

from ppo.entry.argument_groups import (
    DatasetArguments,
    DivergenceArguments,
    EvalGenerationArguments,
    LogprobArguments,
    ModelCommonArguments,
    PaddleNLPTrainingArguments,
    PromptTruncationArguments,
    RolloutArguments,
    shared_field,
)
from ppo.algos.distill import GKD_BETA
from ppo.common.startup_checks import model_config
from ppo.entry.trainer_entry_checks import trainer_entry_problems
from ppo.common.validation import model_dir_problems
from ppo.models.hf_import import hf_config_problems


@dataclass
class ModelArgument(ModelCommonArguments):
    model_name_or_path: str = field(default=None, metadata={"help": "The student: a local model directory (or LoRA "
                                                                    "adapter) to distil into."})
    teacher_model_name_or_path: str = field(
        default=None,
        metadata={"help": "The teacher: a local model directory (or LoRA adapter) with the student's tokenizer (a "
                  "different tokenizer is refused); it may be larger than the student."},
    )


@dataclass
class DataArgument(PromptTruncationArguments, DatasetArguments):
    pass


@dataclass
class DistillArguments:
    """GKD's settings (TRL `GKDConfig` names)."""

    lmbda: float = field(
        default=0.5,
        metadata={"help": "Fraction of the optimiser steps whose answers the student samples itself (on-policy); the "
                  "others use the dataset's answers. Steps are chosen by a fixed schedule, not at random."},
    )
    beta: float = field(
        default=GKD_BETA,
        metadata={"help": "Generalised JSD interpolation: 0 = forward KL(teacher || student), 1 = reverse "
                  "KL(student || teacher), between them JSD with the mixture beta*teacher + (1-beta)*student."},
    )
    # the student's sampling temperature; it also divides both models' logits in the loss
    temperature: float = shared_field(RolloutArguments, "temperature")
    teacher_top_k: int = field(
        default=0,
        metadata={"help": "Compare only the teacher's k most likely tokens (and 'any other token') at each "
                  "position, to cut memory at large vocabularies; 0 = the full distribution."},
    )
    max_dec_len: int = shared_field(RolloutArguments, "max_dec_len")
    min_dec_len: int = shared_field(RolloutArguments, "min_dec_len")


@dataclass
class DistillTrainingArguments(DistillArguments, DivergenceArguments, LogprobArguments, EvalGenerationArguments,
                               PaddleNLPTrainingArguments):
    pass


def distill_setting_problems(training_args):
    """Range checks of the GKD settings and the parallel layouts the loss supports."""
    problems = []
    if not 0.0 <= training_args.lmbda <= 1.0:
        problems.append(f"lmbda must be in [0, 1] (the on-policy fraction), got {training_args.lmbda}")
    if not 0.0 <= training_args.beta <= 1.0:
        problems.append(f"beta must be in [0, 1] (0 forward KL, 1 reverse KL), got {training_args.beta}")
    if not training_args.temperature > 0:
        problems.append(f"temperature must be > 0, got {training_args.temperature}")
    if training_args.teacher_top_k < 0:
        problems.append(f"teacher_top_k must be >= 0 (0 = full distribution), got {training_args.teacher_top_k}")
    if training_args.max_dec_len < 1 or training_args.min_dec_len < 0 or training_args.min_dec_len > training_args.max_dec_len:
        problems.append(f"need 1 <= max_dec_len and 0 <= min_dec_len <= max_dec_len, got max_dec_len "
                        f"{training_args.max_dec_len}, min_dec_len {training_args.min_dec_len}")
    for name in ("tensor_parallel_degree", "pipeline_parallel_degree"):
        if getattr(training_args, name, 1) > 1:
            problems.append(f"{name} {getattr(training_args, name)}: distillation runs data parallel (and LoRA) only; "
                            "the teacher's and the student's heads are evaluated whole on every rank")
    return problems


def validate_arguments(model_args, data_args, training_args):
    """Every problem of a distillation run that needs several argument groups or the file system."""
    dirs = [("model_name_or_path", model_args.model_name_or_path)]
    problems = trainer_entry_problems(model_args, data_args, training_args, dirs)
    if not model_args.teacher_model_name_or_path:
        problems.append("teacher_model_name_or_path is required: the model whose distributions the student learns")
    else:
        teacher = [("teacher_model_name_or_path", model_args.teacher_model_name_or_path)]
        problems += model_dir_problems(teacher) + hf_config_problems(teacher)
    return problems + distill_setting_problems(training_args)


def tokenizer_problems(student, teacher, student_path, teacher_path):
    """Why the teacher's tokenizer is not the student's (None when it is): the loss compares the two
    models' distributions token id by token id, so the ids must mean the same strings. The message
    names the key, both tokenizers (class, path) and the first difference."""
    names = (f"teacher_model_name_or_path: different tokenizers: the student's {type(student).__name__} ({student_path}) "
             f"and the teacher's {type(teacher).__name__} ({teacher_path})")
    a, b = student.get_vocab(), teacher.get_vocab()
    if a != b:
        differ = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: (kv[1], repr(kv[0])))[:3]
        return (f"{names} have vocabularies of {len(a)} and {len(b)} tokens that differ at "
                f"{differ}; distillation compares per-token distributions, so the teacher must use the student's tokenizer")
    for special in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(student, special) != getattr(teacher, special):
            return (f"{names} disagree on {special} ({getattr(student, special)} vs "
                    f"{getattr(teacher, special)}); distillation needs the same tokenizer")
    return None


def vocabulary_problems(student_path, teacher_path):
    """The two models' output vocabularies (config.json `vocab_size`) must agree."""
    student, teacher = model_config(student_path) or {}, model_config(teacher_path) or {}
    vs, vt = student.get("vocab_size"), teacher.get("vocab_size")
    if isinstance(vs, int) and isinstance(vt, int) and vs != vt:
        return [f"the student ({student_path}) has vocab_size {vs} and the teacher ({teacher_path}) {vt}: their "
                "distributions cannot be compared token by token"]
    return []
