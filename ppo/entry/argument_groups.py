"""Argument groups shared by several entry points (each entry point's module subclasses them).

Defaults live here and in the entry points' argument modules only; every field has a help
and is declared once. An entry point whose default of a shared field differs redeclares it
with `default_override` (same help, its own default, a comment saying why); a class that takes a
shared field as it is, without the group, uses `shared_field`. Each group checks
its own fields in its `resolve_group`; the roots (`ModelCommonArguments`, `DatasetArguments`,
`PaddleNLPTrainingArguments`) have the one `__post_init__`, `resolve_arguments`, which runs every
group's in one pass, so every problem of an instance is reported together (see `argument_problems`).
"""
from dataclasses import dataclass, field
from typing import ClassVar, List, Optional

from paddlenlp.trainer import TrainingArguments

from ..data.base import DEFAULT_TEMPLATE
from ..data.tokenized import DEFAULT_MAX_LENGTH
from ..evaluation.generation import LONG_ANSWER_LEN
from ..models.causal_lm import DEFAULT_LOGPROB_CHUNK_SIZE
from ..models.loading import DEFAULT_LORA_TARGETS
from ..rollout.ops import KERNEL_MODES
from ..common.argument_problems import PADDLENLP_REFUSALS, paddlenlp_refusal, resolve_arguments
from ..common.field_bounds import default_override, ranged_field, shared_field  # noqa: F401  (imported from here)

RECOMPUTE_GRANULARITIES = ("full", "full_attn", "core_attn")
DEFAULT_EVAL_MAX_NEW_TOKENS = 32
BEAVER_TEMPLATE = DEFAULT_TEMPLATE  # the Beaver (safe-rlhf) template, as ppo.data declares it


@dataclass
class LoRAArguments:
    use_lora: bool = field(default=False, metadata={"help": "Train a LoRA adapter instead of all weights."})
    lora_rank: int = ranged_field(8, minimum=1, help="LoRA rank r.")
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha; the adapter is scaled by alpha / r."})
    lora_target_modules: str = field(
        default=DEFAULT_LORA_TARGETS,
        metadata={"help": "Comma-separated regexes of the linear layers that get an adapter."},
    )
    rslora: bool = field(default=False, metadata={"help": "rsLoRA: scale the adapter by alpha / sqrt(r) instead of alpha / r."})
    lora_plus_scale: float = field(
        default=1.0, metadata={"help": "LoRA+: learning-rate multiplier of the adapter's B matrices (1.0: plain LoRA)."}
    )
    rslora_plus: bool = field(
        default=False, metadata={"help": "PaddleNLP's rsLoRA+ preset: rslora, lora_plus_scale 4 and lora_alpha 4."}
    )
    lora_trainable_modules: str = field(
        default="",
        metadata={"help": "Comma-separated regexes (matched in full) of weights trained whole and saved with the adapter, "
                  "e.g. '.*embed_tokens.*,lm_head.*' (PEFT's modules_to_save; PaddleNLP's trainable_modules)."},
    )

    def lora_settings(self):
        """`apply_lora` keyword arguments: rank, alpha, targets, rslora, LoRA+ (the rslora_plus preset wins) and
        the whole-weight `trainable_modules` (None when empty)."""
        trainable = [t.strip() for t in self.lora_trainable_modules.split(",") if t.strip()] or None
        if self.rslora_plus:
            return dict(rank=self.lora_rank, alpha=4, target_modules=self.lora_target_modules, rslora=True, lora_plus_scale=4.0,
                        trainable_modules=trainable)
        return dict(
            rank=self.lora_rank, alpha=self.lora_alpha, target_modules=self.lora_target_modules,
            rslora=self.rslora, lora_plus_scale=self.lora_plus_scale, trainable_modules=trainable,
        )


@dataclass
class ModelCommonArguments(LoRAArguments):
    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"recompute_granularity": "ppo.entry.argument_groups:RECOMPUTE_GRANULARITIES"}
    use_flash_attention: bool = field(
        default=False, metadata={"help": "Use flash attention in the models (GPU builds of Paddle only)."}
    )
    recompute_granularity: str = field(
        default="full", metadata={"help": f"What `recompute` recomputes in the backward pass: {' | '.join(RECOMPUTE_GRANULARITIES)}."}
    )
    recompute_use_reentrant: bool = field(default=False, metadata={"help": "Use Paddle's reentrant recompute."})
    use_train_patch: bool = field(
        default=True,
        metadata={"help": "Fused RMSNorm, RoPE, SwiGLU and attention in PaddleNLP's Llama/Qwen2 for training and scoring: "
                  "C++ kernels with backward (csrc/cpu/train_*.cc, ppo/models/train_patch.py) on a CPU build, Paddle's "
                  "fused RMSNorm/RoPE and (bf16/fp16) flash attention on a CUDA build; false keeps PaddleNLP's own."},
    )
    use_fused_rms_norm: bool = field(default=False, metadata={"help": "Fused RMSNorm kernel (GPU builds only)."})
    use_fused_rope: bool = field(default=False, metadata={"help": "Fused rotary-embedding kernel (GPU builds only)."})
    use_fused_head_and_loss_fn: bool = field(
        default=False, metadata={"help": "Fused LM head + cross-entropy kernel (GPU builds only)."}
    )
    fused_linear: bool = field(default=False, metadata={"help": "Fused matmul+bias linear layers (GPU builds only)."})
    use_fused_linear: bool = field(default=False, metadata={"help": "PaddleNLP's newer name of fused_linear (GPU builds only)."})
    flash_mask: bool = field(
        default=False, metadata={"help": "FlashMask attention over packed sequences (GPU builds with flash attention only)."}
    )
    tensor_parallel_output: bool = field(
        default=False,
        metadata={"help": "Keep tensor-parallel logits split over ranks; the trainers here need gathered logits, so true is "
                  "refused at tensor_parallel_degree > 1 (at 1 there is nothing to split: the same run either way)."},
    )

    __post_init__ = resolve_arguments

    def resolve_group(self):
        if self.recompute_granularity not in RECOMPUTE_GRANULARITIES:
            return [f"recompute_granularity must be one of {RECOMPUTE_GRANULARITIES}, got {self.recompute_granularity!r}"]
        return []


@dataclass
class DivergenceArguments:
    stop_on_divergence: bool = field(
        default=False,
        metadata={"help": "Stop the run (keeping the last checkpoint) when a loss, KL or gradient norm diverges."},
    )
    divergence_factor: float = ranged_field(
        10.0, above=1.0, help="A watched metric diverges when it exceeds this many times its recent median (floor 1.0).")
    divergence_window: int = ranged_field(
        10, minimum=2,
        help="Recent values per metric (one per optimiser step or log) the divergence check compares with.")


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

    def resolve_group(self):
        if self.logprob_chunk_size < 0:
            return [f"logprob_chunk_size must be >= 0 (0 = full logits), got {self.logprob_chunk_size}"]
        return []


@dataclass
class GenerationArguments:
    """Generation by the rollout engine, shared by PPO/GRPO (rollouts and evaluation) and the
    generation evaluation of SFT and the DPO family."""

    use_fusemt: bool = field(
        default=True,
        metadata={"help": "Generate with the fast rollout engine (ppo/rollout/engine.py; PaddleNLP's name); false: "
                  "PaddleNLP's generate."},
    )
    eval_max_new_tokens: int = ranged_field(
        0, minimum=0, help="Most new tokens per answer when evaluating by generation; 0: max_dec_len in PPO/GRPO, "
                           f"{DEFAULT_EVAL_MAX_NEW_TOKENS} in SFT and the DPO family.")

    def eval_new_tokens(self, default=None):
        """`eval_max_new_tokens`, or `default` (SFT/DPO: DEFAULT_EVAL_MAX_NEW_TOKENS) when it is 0."""
        return self.eval_max_new_tokens or (DEFAULT_EVAL_MAX_NEW_TOKENS if default is None else default)


@dataclass
class EvalGenerationArguments(GenerationArguments):
    """SFT and the DPO family: greedy exact-match evaluation on held-out prompts."""

    eval_with_do_generation: bool = field(
        default=True,
        metadata={"help": "Also greedy-decode the held-out prompts and report exact-match accuracy."},
    )


@dataclass
class RolloutArguments:
    """Sampling prompts and responses with the rollout engine: PPO/GRPO (`run_ppo.py`) and online
    DPO (`run_online_dpo.py`, where one step is one round), with PaddleNLP's PPO names."""

    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"rollout_kernels": "ppo.rollout.ops:KERNEL_MODES"}

    per_device_prompt_batch_size: int = ranged_field(
        16, minimum=1, help="Prompts per data-parallel rank per step (online DPO: per round); PPO/GRPO's default None: "
                            "global_batch_size / data-parallel ranks, or 16.")
    rollout_n: int = ranged_field(
        1, minimum=1, help="Samples per prompt: the group size of GRPO/RLOO; online DPO's answers per prompt (>= 2).")
    max_dec_len: int = ranged_field(64, minimum=1, help="Most new tokens per response.")
    min_dec_len: int = ranged_field(1, minimum=0, help="EOS is suppressed until this many tokens were generated.")
    temperature: float = ranged_field(
        1.0, range=(0.0, False, None, False),
        help="Sampling temperature (PPO/GRPO compute the log-probs with it too; online DPO's DPO log-probs use 1.0).")
    top_p: float = ranged_field(1.0, range=(0.0, False, 1.0, True), help="Nucleus sampling threshold.")
    top_k: int = ranged_field(0, range=(0, True, None, False), help="Top-k sampling; 0 disables it.")
    repetition_penalty: float = ranged_field(
        1.0, range=(0.0, False, None, False), help="Repetition penalty (1.0 = none).")
    missing_eos_penalty: float = ranged_field(
        0.0, range=(0.0, True, None, False), help="Subtracted from the score of responses that end without EOS (TRL).")
    num_sample_generations: int = ranged_field(
        10, minimum=0, help="Every this many steps, log a table of samples (online DPO: of sampled pairs; 0: never).")
    dataloader_shuffle: bool = field(
        default=True, metadata={"help": "Draw the prompts of each epoch in a seeded random order (False: file order)."}
    )
    rollout_kernels: str = field(
        default="auto",
        metadata={"help": "Kernels of the rollout engine (use_fusemt true): auto = the compiled ones of csrc/, each first run "
                  "once on a small fixed input against Paddle's plain ops on the model's device and dtype, with the pure-Paddle "
                  "path (ppo/rollout/fallback.py) for any that disagrees, raises or gives NaN (one warning names it); "
                  "custom = the compiled kernels unchecked (an error when they are not built); paddle = the pure-Paddle "
                  "path for every op."},
    )

    def resolve_group(self):
        if self.rollout_kernels not in KERNEL_MODES:
            return [f"rollout_kernels must be one of {KERNEL_MODES}, got {self.rollout_kernels!r}"]
        if self.rollout_kernels != "auto" and not getattr(self, "use_fusemt", True):
            return [f"rollout_kernels {self.rollout_kernels} picks the rollout engine's kernels, and use_fusemt false "
                    "generates with PaddleNLP's generate instead: set use_fusemt true or rollout_kernels auto"]
        return []


@dataclass
class OnlineRolloutArguments(RolloutArguments, DivergenceArguments, LogprobArguments, GenerationArguments):
    """The groups the online loops (PPO/GRPO, online DPO) always take together, and the loop's optimisation."""

    # an RL run that diverges is stopped by default (DivergenceArguments: off for SFT/RM/DPO)
    stop_on_divergence: bool = default_override(DivergenceArguments, "stop_on_divergence", True)

    update_iters: int = ranged_field(
        1, minimum=1, help="Passes over each rollout batch (PPO epochs; online DPO: over each round's pairs).")
    min_learning_rate: float = ranged_field(
        0.0, range=(0.0, True, None, False), help="Learning-rate floor for cosine/linear decay (PPO: the actor's).")
    use_fused_adamw: bool = field(
        default=True,
        metadata={"help": "AdamW steps (PPO: actor and critic) as one C++ op over all parameters with the gradient clip "
                  "folded in (csrc/cpu/train_adamw.cc; float32 CPU parameters, same state and results as Paddle's "
                  "AdamW); elsewhere, and under fleet's optimizer wrappers, Paddle's own step runs."},
    )
    max_nan_skips: int = ranged_field(3, minimum=0, help="Consecutive non-finite steps tolerated before the run stops.")

    @property
    def release_gradients(self):
        """Free gradients after each optimiser step (`release_grads`, or `enable_release_grads` in
        `sharding_parallel_config`, as PaddleNLP) instead of keeping them as zeros."""
        config = self.sharding_parallel_config
        options = config.replace(",", " ").split() if isinstance(config, str) else list(config or ())
        return bool(self.release_grads) or "enable_release_grads" in options


@dataclass
class PaddleNLPTrainingArguments(TrainingArguments):
    """PaddleNLP's `TrainingArguments`, whose own `__post_init__` runs as the first group of the
    one pass (`resolve_arguments`), its refusals joining the problem list of the entry point
    instead of stopping the parse. Placed last among the bases of each entry point's training
    arguments (right before `TrainingArguments`)."""

    __post_init__ = resolve_arguments

    def resolve_group(self):
        self.paddlenlp_refused = False
        # PaddleNLP's own expert parallelism (inside sharding, GPU kernels) is not the one this
        # toolkit runs (ppo.strategy.expert, carved out of the data ranks): hidden from its set-up
        expert_degree, self.expert_parallel_degree = self.expert_parallel_degree, -1
        try:
            TrainingArguments.__post_init__(self)
        except PADDLENLP_REFUSALS as error:
            self.paddlenlp_refused = True  # the fields PaddleNLP normalises may be left raw: skip checks on them
            return [paddlenlp_refusal(error)]
        finally:
            self.expert_parallel_degree = expert_degree
        return []


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
    max_length: int = ranged_field(
        DEFAULT_MAX_LENGTH, minimum=1, help="Longest tokenised prompt+answer; longer answers are truncated.")
    eval_long_answer_len: int = ranged_field(
        LONG_ANSWER_LEN, minimum=0, help="Reference answers at least this many characters long count as 'long' in eval/accuracy_long.")
    chat_template: Optional[str] = field(
        default=None,
        metadata={"help": "PaddleNLP's chat template file for use_chat_template: a chat_template.json (or .jinja) file, a "
                  "directory holding chat_template.json, or 'none' (no chat template); unset: the tokenizer's own."},
    )
    chat_template_kwargs: dict = field(
        default_factory=dict,
        metadata={"help": "Arguments of the Jinja chat template, passed to every render (TRL's chat_template_kwargs, "
                  "verl's apply_chat_template_kwargs), e.g. {\"enable_thinking\": false} for Qwen3; a key the "
                  "template does not read is refused."},
    )

    __post_init__ = resolve_arguments

    def resolve_group(self):
        from ..data.chat_template_file import chat_template_problem, chat_template_kwargs_problem

        return [p for p in [chat_template_problem(self.chat_template),
                            chat_template_kwargs_problem(self.chat_template_kwargs, self.use_chat_template)] if p]

    def dataset_kwargs(self, tokenizer, seed):
        """Keyword arguments every tokenised dataset of a run is built with; the tokenizer gets the
        run's `chat_template` and `chat_template_kwargs` first (`ppo.data.chat_template_file`)."""
        from ..data.chat_template_file import apply_chat_template_setting

        apply_chat_template_setting(tokenizer, self.chat_template, self.chat_template_kwargs)
        return dict(tokenizer=tokenizer, prompt_template=self.prompt_template, use_chat_template=self.use_chat_template, seed=seed)


@dataclass
class PromptFieldArguments:
    """PPO/GRPO and online DPO: the record fields of the prompt data (PaddleNLP's and verl's names)."""

    prompt_key: Optional[str] = field(
        default=None,
        metadata={"help": "Field of the prompt in train_datasets / eval_datasets records (PaddleNLP: src), read as the "
                  "format's prompt field (Jsonfile src, json input, alpaca instruction, trl-prompt / PKU-SafeRLHF "
                  "prompt); none: each format's own. ptx_datasets keep their own names."},
    )
    response_key: Optional[str] = field(
        default=None,
        metadata={"help": "Field of the reference answer in train_datasets / eval_datasets records (PaddleNLP: tgt), read "
                  "as Jsonfile tgt or trl-prompt solution (the label a reward server or rule checks) or alpaca output; "
                  "none: each format's own. Formats without a single answer field refuse it."},
    )

    def prompt_field_keys(self):
        """`prompt_key` / `response_key` as keyword arguments of a prompt dataset."""
        return dict(prompt_key=self.prompt_key, response_key=self.response_key)


@dataclass
class PromptTruncationArguments:
    """SFT and the DPO family: long prompts are truncated (PPO/GRPO drop them with `max_prompt_len`)."""

    truncate_prompt_len: Optional[int] = ranged_field(
        None, minimum=1, help="Prompts longer than this many tokens keep their last ones (truncated, never dropped; "
                              "PaddleNLP's src_length and DPO max_prompt_len are read as this); none: whole prompts. "
                              "PPO/GRPO's max_prompt_len drops long prompts instead.")


@dataclass
class ZeroPaddingArguments:
    """SFT, the reward model and the DPO family: packed batches (PaddleNLP's `zero_padding`)."""

    zero_padding: bool = field(
        default=False,
        metadata={"help": "Pack each batch's samples into rows of at most max_length tokens (per-sample position ids, "
                  "block-diagonal causal mask): the same losses and gradients as padding, without the pad tokens' work "
                  "(PaddleNLP's name; SFT, the reward model's sequence-wise loss and the DPO family; not with pipeline "
                  "parallel)."},
    )


@dataclass
class StreamingArguments:
    """SFT, the reward model and the DPO family: PaddleNLP's `lazy` (`ppo.data.streaming`)."""

    lazy: bool = field(
        default=False,
        metadata={"help": "Stream the training data (PaddleNLP's name): JSON-lines files read and tokenised one record at "
                  "a time while training, in file order (no shuffling), memory bounded whatever the file's size; a resume "
                  "starts at the record after the checkpoint's last one. Needs max_steps; the eval data is read whole."},
    )


@dataclass
class BenchmarkArguments:
    """SFT, the reward model and the DPO family: PaddleNLP's `benchmark` (`ppo.entry.benchmark`)."""

    benchmark: bool = field(
        default=False,
        metadata={"help": "Benchmark mode (PaddleNLP's name): train only, with no evaluation, no checkpoint and no final "
                  "model, and write the timing report output_dir/benchmark.json (runtime, steps/s, samples/s, tokens/s)."},
    )


def split_specs(specs):
    """Dataset specs from a list argument; an empty list gives None."""
    specs = [s for s in (specs or []) if s]
    return specs or None
