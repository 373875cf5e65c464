"""The DPO family (DPO, cDPO, IPO, hinge, SimPO, ORPO, KTO, kto_pair, sppo_hard, nca_pair, dpop),
full or LoRA, from a JSON or YAML argument file.

    python -m paddle.distributed.launch dpo/run_dpo.py config/tiny/dpo_argument.json [--flag value ...]

Trains on preference pairs (`PreferenceDataset`; KTO turns each pair into one
desirable and one undesirable example). The reference model is a frozen copy of
`ref_model_name_or_path` (default: `model_name_or_path`), or, with `use_lora`,
the policy with its adapter disabled; SimPO, ORPO and `reference_free` load none.
Writes the model (or adapter) to `output_dir` with `metrics.jsonl`, `summary.json`,
`resolved_arguments.json` and VisualDL logs under `logging_dir`.
"""
import os
import sys

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")  # before paddle: 3-4x faster matmuls on AVX2-only CPUs
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import dataclass, field  # noqa: E402
from typing import List, Optional  # noqa: E402

from paddlenlp.trainer import TrainingArguments  # noqa: E402

from dpo.dpo_trainer import LOSS_TYPES, DPOTrainer, KTOCollator, needs_reference  # noqa: E402
from ppo.algos.preference import PAIR_LOSS_TYPES  # noqa: E402
from ppo.common.args_common import DatasetArguments, DivergenceArguments, LogprobArguments, ModelCommonArguments, split_specs  # noqa: E402
from ppo.common.arguments import parse_arguments, save_resolved_arguments  # noqa: E402
from ppo.common.process_exit import run_and_exit  # noqa: E402
from ppo.common.run_setup import finish_trainer_run  # noqa: E402
from ppo.common.validation import validate_run  # noqa: E402
from ppo.common.trainer_callbacks import TrackerCallback  # noqa: E402
from ppo.data import PreferenceDataset, PromptOnlyDataset  # noqa: E402
from ppo.models.pipeline import AnswerNLLCriterion, CausalLMPipelineInputs, check_pipeline_run, load_pipe  # noqa: E402
from ppo.models.preference_pipe import PreferencePolicyInputs  # noqa: E402
from ppo.models.adapters import load_merged_causal_lm  # noqa: E402
from ppo.models.loading import (  # noqa: E402
    apply_lora,
    freeze,
    load_causal_lm,
    load_overrides,
    load_reference,
    load_tokenizer,
    set_dropout_off,
    training_dtype,
)


@dataclass
class ModelArgument(ModelCommonArguments):
    model_name_or_path: str = field(default=None, metadata={"help": "Local model directory (or LoRA adapter) to align."})
    ref_model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "Reference model directory; default model_name_or_path (a LoRA policy: itself, adapter off)."},
    )


@dataclass
class DataArgument(DatasetArguments):
    eval_generation_datasets: List[str] = field(
        default_factory=list,
        metadata={"help": "Prompt datasets with reference answers (e.g. Jsonfile with tgt) for greedy exact-match evaluation."},
    )
    eval_max_new_tokens: int = field(default=32, metadata={"help": "Generation length for held-out exact-match evaluation."})
    max_prompt_len: Optional[int] = field(
        default=None, metadata={"help": "Prompts longer than this many tokens keep their last ones (as PaddleNLP); none: whole."}
    )


@dataclass
class DPOTrainingArguments(DivergenceArguments, LogprobArguments, TrainingArguments):
    loss_type: str = field(default="sigmoid", metadata={"help": f"Preference loss: {' | '.join(LOSS_TYPES)}."})
    beta: float = field(
        default=0.1, metadata={"help": "Inverse temperature of the implicit reward (ORPO: the weight lambda of the odds-ratio term)."}
    )
    label_smoothing: float = field(
        default=0.0, metadata={"help": "cDPO / robust SimPO: assumed probability that a preference label is flipped, in [0, 0.5)."}
    )
    simpo_gamma: float = field(default=0.5, metadata={"help": "SimPO target reward margin gamma."})
    sft_loss_ratio: float = field(
        default=0.0, metadata={"help": "Weight of the NLL of the chosen answers (token mean) added to the preference loss."}
    )
    pref_loss_ratio: float = field(
        default=1.0, metadata={"help": "Weight of the preference loss (PaddleNLP: loss = pref_loss_ratio * pref + sft_loss_ratio * NLL)."}
    )
    dpop_lambda: float = field(default=50.0, metadata={"help": "dpop: weight of the penalty max(0, ref_c - pi_c) (PaddleNLP default 50)."})
    reference_free: bool = field(
        default=False, metadata={"help": "sigmoid/ipo/hinge against a uniform reference (log-probs 0): no reference model."}
    )
    desirable_weight: float = field(default=1.0, metadata={"help": "KTO weight of the desirable (chosen) examples."})
    undesirable_weight: float = field(default=1.0, metadata={"help": "KTO weight of the undesirable (rejected) examples."})
    eval_with_do_generation: bool = field(
        default=True, metadata={"help": "Also greedy-decode eval_generation_datasets and report exact-match accuracy."}
    )
    use_fusemt: bool = field(default=True, metadata={"help": "Use the fast rollout engine for evaluation generation."})

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.beta <= 0:
            raise ValueError(f"beta must be positive, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must lie in [0, 0.5), got {self.label_smoothing}")
        if self.label_smoothing and self.loss_type not in ("sigmoid", "simpo"):
            raise ValueError(f"label_smoothing applies to sigmoid and simpo only, not {self.loss_type!r}")
        if self.pref_loss_ratio < 0:
            raise ValueError(f"pref_loss_ratio must be >= 0, got {self.pref_loss_ratio}")
        if self.pref_loss_ratio == 0 and self.sft_loss_ratio == 0:
            raise ValueError("pref_loss_ratio and sft_loss_ratio are both 0: nothing to train")
        if self.loss_type in PAIR_LOSS_TYPES and self.reference_free:
            raise ValueError(f"{self.loss_type} needs a reference model; reference_free applies to sigmoid, ipo and hinge")
        if self.sft_loss_ratio < 0:
            raise ValueError(f"sft_loss_ratio must be >= 0, got {self.sft_loss_ratio}")
        if self.loss_type == "orpo" and self.sft_loss_ratio:
            raise ValueError("orpo already includes the NLL of the chosen answers; leave sft_loss_ratio at 0")
        if self.loss_type == "kto" and self.reference_free:
            raise ValueError("kto needs a reference model; reference_free applies to sigmoid, ipo and hinge")


def load_pipeline_models(model_args, training_args, overrides):
    """This rank's stages of the policy pipe (its loss is set by `DPOTrainer`) and of the
    frozen reference pipe (None when the loss needs no reference), under
    `pipeline_parallel_degree > 1`."""
    check_pipeline_run(training_args, model_args.use_lora)
    steps = training_args.gradient_accumulation_steps
    model = set_dropout_off(load_pipe(model_args.model_name_or_path, None, PreferencePolicyInputs(steps), **overrides))
    if not needs_reference(training_args.loss_type, training_args.reference_free):
        return model, None
    ref_path = model_args.ref_model_name_or_path or model_args.model_name_or_path
    reference = load_pipe(ref_path, AnswerNLLCriterion(), CausalLMPipelineInputs(steps), **overrides)
    return model, freeze(set_dropout_off(reference))


def build_trainer(model_args, data_args, training_args):
    """Models, datasets and the `DPOTrainer` for parsed arguments."""
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required")
    path = model_args.model_name_or_path
    extra = load_overrides(model_args, training_args, pipeline_entry="dpo")
    tokenizer = load_tokenizer(path)
    if training_args.pipeline_parallel_degree > 1:
        model, ref_model = load_pipeline_models(model_args, training_args, extra)
    else:
        if model_args.use_lora:  # an SFT adapter is merged first and a fresh adapter trained (as TRL does)
            model = apply_lora(load_merged_causal_lm(path, **extra), base_model_name_or_path=path, **model_args.lora_settings())
        else:
            model = load_causal_lm(path, **extra)
        set_dropout_off(model)
        # the reference: none for SimPO/ORPO/reference_free; a LoRA policy with its adapter off; else a frozen copy
        ref_model = None
        if needs_reference(training_args.loss_type, training_args.reference_free):
            ref_model = load_reference(model, path, model_args.ref_model_name_or_path, training_dtype(training_args), **extra)

    data_kwargs = data_args.dataset_kwargs(tokenizer, training_args.seed)
    train_dataset = PreferenceDataset(
        split_specs(data_args.train_datasets), max_length=data_args.max_length, truncate_prompt_to=data_args.max_prompt_len, **data_kwargs
    )
    eval_specs = split_specs(data_args.eval_datasets)
    eval_dataset = (
        PreferenceDataset(eval_specs, max_length=data_args.max_length, truncate_prompt_to=data_args.max_prompt_len, **data_kwargs)
        if eval_specs
        else None
    )
    gen_specs = split_specs(data_args.eval_generation_datasets)
    eval_prompts = None
    if gen_specs and training_args.eval_with_do_generation:
        eval_prompts = PromptOnlyDataset(gen_specs, max_prompt_len=data_args.max_length, **data_kwargs)
    collator = train_dataset.get_collator()
    if training_args.loss_type == "kto":
        collator = KTOCollator(collator, max_length=data_args.max_length)

    return DPOTrainer(
        model=model,
        ref_model=ref_model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        tokenizer=tokenizer,
        callbacks=[TrackerCallback(training_args.output_dir, loss_name="loss/total")],
        eval_prompt_dataset=eval_prompts,
        eval_max_new_tokens=data_args.eval_max_new_tokens,
        eval_long_answer_len=data_args.eval_long_answer_len,
        use_fusemt=training_args.use_fusemt,
    )


def main(argv=None, training_arguments=None):
    """Parse `argv` (default `sys.argv[1:]`) and train; `training_arguments` replaces
    `DPOTrainingArguments` (e.g. `dpo/run_kto.py`'s, whose `loss_type` defaults to kto)."""
    classes = (ModelArgument, DataArgument, training_arguments or DPOTrainingArguments)
    model_args, data_args, training_args = parse_arguments(classes, argv)
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required")
    validate_run(
        (model_args, data_args, training_args),
        model_dirs=[(n, getattr(model_args, n)) for n in ("model_name_or_path", "ref_model_name_or_path")],
    )
    save_resolved_arguments(training_args.output_dir, model_args, data_args, training_args)
    trainer = build_trainer(model_args, data_args, training_args)
    return finish_trainer_run(trainer, training_args, trainer.tokenizer)


if __name__ == "__main__":
    run_and_exit(main)
