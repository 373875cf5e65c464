"""Start-up checks shared by the `Trainer` entry points (SFT, RM, the DPO family), which run
PaddleNLP's Trainer; PPO/GRPO has its own loop and checks (`ppo/entry/ppo_argument_checks.py`)."""
from ..common.report_writers import TRAINER_PACKAGES, missing_report_packages
from ..strategy import expert_layout_problems, expert_model_problems
from ..strategy import tensor_model_problems
from ..common.validation import (
    dtype_device_problems,
    model_dir_problems,
    output_dir_problems,
    pipeline_problems,
    required_problems,
    size_problems,
    split_logits_problems,
)
from ..models.hf_import import hf_config_problems


def do_train_problems(training_args, has_eval_data):
    """SFT/RM/DPO: `do_train` false trains and saves nothing, which is refused unless
    `do_eval` asks for an evaluation-only run (with eval data); `do_predict` is not implemented."""
    problems = []
    if training_args.do_predict:
        problems.append("do_predict true: prediction on a test set is not implemented here; use do_eval with eval_datasets")
    if training_args.do_train:
        return problems
    if not training_args.do_eval:
        problems.append("do_train is false or missing: the run would train and save nothing; set do_train true "
                        "(or do_eval true with eval_datasets for an evaluation-only run)")
    elif not has_eval_data:
        problems.append("do_train false with do_eval true evaluates only, but no eval_datasets are given: nothing to do")
    return problems


def zero_padding_problems(data_args, training_args):
    """`zero_padding` packs rows with a 4-D attention mask, which pipeline stages do not take."""
    if getattr(data_args, "zero_padding", False) and training_args.pipeline_parallel_degree > 1:
        return ["zero_padding packs rows with a 4-D attention mask, which the pipeline stages do not take: "
                "set zero_padding false or pipeline_parallel_degree 1"]
    return []


def run_mode_problems(data_args, training_args):
    """`lazy` streams an unknown number of records, so the run needs `max_steps`; its batches are
    read in the training process (whose position each checkpoint saves), not by loader workers or
    PaddleNLP's pipeline loader. `benchmark` times training, so it needs `do_train`."""
    problems = []
    if getattr(data_args, "lazy", False):
        if training_args.max_steps <= 0:
            problems.append("lazy true streams the data without counting it first: set max_steps (the run's length)")
        if training_args.pipeline_parallel_degree > 1:
            problems.append("lazy true with pipeline_parallel_degree > 1: streamed data is not implemented for pipeline "
                            "stages; set lazy false")
        if training_args.dataloader_num_workers > 0:
            problems.append("lazy true reads the stream in the training process, where each checkpoint records its "
                            "position: set dataloader_num_workers 0")
    if getattr(training_args, "benchmark", False) and not training_args.do_train:
        problems.append("benchmark true times the training, and do_train is false: set do_train true")
    if getattr(training_args, "benchmark", False) and training_args.resume_from_checkpoint:
        problems.append("benchmark true times a run from its start and saves no checkpoint: leave resume_from_checkpoint "
                        "unset")
    return problems


def trainer_entry_problems(model_args, data_args, training_args, model_dirs):
    """The checks every `Trainer` entry point (SFT, RM, DPO) shares: sizes, `model_name_or_path`
    required, the model directories `(argument name, path)`, output_dir, dtype/device,
    do_train, pipeline parallel (and `zero_padding` with it), `lazy`."""
    problems = size_problems(model_args, data_args, training_args)
    problems += required_problems(model_args, ["model_name_or_path"])
    problems += model_dir_problems(model_dirs) + hf_config_problems(model_dirs)
    problems += output_dir_problems(training_args.output_dir, model_dirs)
    problems += dtype_device_problems(training_args)
    problems += split_logits_problems(model_args, training_args)
    has_eval = bool([s for s in data_args.eval_datasets if s] or [s for s in getattr(data_args, "eval_generation_datasets", []) if s])
    problems += do_train_problems(training_args, has_eval)
    problems += pipeline_problems(training_args, model_args.use_lora)
    problems += expert_layout_problems(training_args, getattr(training_args, "runs_expert_parallel", False),
                                       model_args.use_lora, trainer=True)
    problems += expert_model_problems(training_args, model_dirs[:1])
    problems += tensor_model_problems(training_args, model_dirs)
    problems += zero_padding_problems(data_args, training_args)
    problems += run_mode_problems(data_args, training_args)
    problems += missing_report_packages(training_args.report_to or [], TRAINER_PACKAGES)  # PaddleNLP's integrations
    return problems
