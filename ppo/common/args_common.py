"""Argument groups shared by several entry points (each entry point subclasses them).

Defaults live here and in the entry points' dataclasses only; every field has a help.
"""
from dataclasses import dataclass, field
from typing import List

from ..models.causal_lm import DEFAULT_LOGPROB_CHUNK_SIZE
from ..models.loading import DEFAULT_LORA_TARGETS

BEAVER_TEMPLATE = "BEGINNING OF CONVERSATION: USER: {input} ASSISTANT:"


@dataclass
class LoRAArguments:
    use_lora: bool = field(default=False, metadata={"help": "Train a LoRA adapter instead of all weights."})
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha; the adapter is scaled by alpha / r."})
    lora_target_modules: str = field(
        default=DEFAULT_LORA_TARGETS,
        metadata={"help": "Comma-separated regexes of the linear layers that get an adapter."},
    )


@dataclass
class ModelCommonArguments(LoRAArguments):
    use_flash_attention: bool = field(
        default=False, metadata={"help": "Use flash attention in the models (GPU builds of Paddle only)."}
    )


@dataclass
class LogprobArguments:
    """Mixed into the training arguments of the entry points whose losses use LM log-probs
    (SFT, DPO, PPO/GRPO; the reward model has no LM head)."""

    logprob_chunk_size: int = field(
        default=DEFAULT_LOGPROB_CHUNK_SIZE,
        metadata={
            "help": "Answer/response tokens per LM-head chunk when computing log-probs and entropy from hidden "
            "states (memory of order chunk x vocabulary); 0 computes full [batch, seq, vocab] logits."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.logprob_chunk_size < 0:
            raise ValueError(f"logprob_chunk_size must be >= 0 (0 = full logits), got {self.logprob_chunk_size}")


@dataclass
class DatasetArguments:
    train_datasets: List[str] = field(
        default_factory=list,
        metadata={"help": "Training datasets: 'name', 'name:proportion' or 'name:proportion:path' (several allowed)."},
    )
    eval_datasets: List[str] = field(
        default_factory=list, metadata={"help": "Evaluation datasets, in the same spec format."}
    )
    prompt_template: str = field(
        default=BEAVER_TEMPLATE, metadata={"help": "Prompt template with an {input} slot (Beaver template by default)."}
    )
    use_chat_template: bool = field(
        default=False, metadata={"help": "Format prompts with the tokenizer's chat template instead of prompt_template."}
    )
    max_length: int = field(default=512, metadata={"help": "Longest tokenised prompt+answer; longer answers are truncated."})
    eval_long_answer_len: int = field(
        default=5, metadata={"help": "Reference answers at least this many characters long count as 'long' in eval/accuracy_long."}
    )

    def dataset_kwargs(self, tokenizer, seed):
        """Keyword arguments every tokenised dataset of a run is built with."""
        return dict(tokenizer=tokenizer, prompt_template=self.prompt_template, use_chat_template=self.use_chat_template, seed=seed)


def split_specs(specs):
    """Dataset specs from a list argument; an empty list gives None."""
    specs = [s for s in (specs or []) if s]
    return specs or None
