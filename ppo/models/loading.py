"""Load tokenizers and causal LMs from local directories, with optional LoRA.

A directory holding `lora_config.json` is a LoRA adapter: its base model is read
from `base_model_name_or_path` in that file (or given explicitly) and wrapped
with `paddlenlp.peft.LoRAModel`. `disable_lora()` on such a model gives the
base model's outputs with no second copy of the base weights.
"""
import logging

from ..common.validation import is_lora_dir  # noqa: F401  (re-exported: the models' callers import it from here)
from .adapters import load_causal_lm  # noqa: F401  (re-exported, as the basics below)
from .basics import (  # noqa: F401
    find_lora_model,
    freeze,
    is_lora_model,
    load_tokenizer,
    lora_base_path,
    lora_disabled,
    set_dropout_off,
    unwrap_model,
    unwrap_parallel,
)
from .train_patch import patch_overrides

logger = logging.getLogger(__name__)

DEFAULT_LORA_TARGETS = ".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj).*"


def apply_lora(
    model, rank=8, alpha=16, target_modules=DEFAULT_LORA_TARGETS, base_model_name_or_path=None, trainable_modules=None,
    rslora=False, lora_plus_scale=1.0,
):
    """Wrap `model` in a fresh `LoRAModel`; only the adapter weights (and `trainable_modules`
    regexes, e.g. a score head) stay trainable. `rslora` scales the adapter by
    alpha / sqrt(rank); `lora_plus_scale` multiplies the learning rate of the B matrices
    (LoRA+, set as the parameters' learning-rate attribute by PaddleNLP's LoRA layers)."""
    from paddlenlp.peft import LoRAConfig, LoRAModel

    targets = [t.strip() for t in target_modules.split(",")] if isinstance(target_modules, str) else list(target_modules)
    config = LoRAConfig(
        target_modules=targets,
        trainable_modules=trainable_modules,
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        rslora=rslora,
        lora_plus_scale=lora_plus_scale,
        merge_weights=False,
        base_model_name_or_path=base_model_name_or_path,
        dtype=str(model.config.dtype) if getattr(model.config, "dtype", None) else None,
    )
    lora_model = LoRAModel(model, config)
    lora_model.mark_only_lora_as_trainable()
    return lora_model


def training_dtype(training_args):
    """Model dtype for the `bf16` / `fp16` flags of `TrainingArguments`."""
    return "bfloat16" if getattr(training_args, "bf16", False) else "float16" if getattr(training_args, "fp16", False) else "float32"


GPU_ONLY_SWITCHES = {
    "use_fused_rms_norm": "fuse RMSNorm into one GPU kernel",
    "use_fused_rope": "apply rotary embeddings with a fused GPU kernel",
    "use_fused_head_and_loss_fn": "fuse the LM head and cross-entropy into one GPU kernel",
    "fused_linear": "use fused matmul+bias GPU kernels in linear layers",
    "use_fused_linear": "use fused matmul+bias GPU kernels in linear layers",
    "flash_mask": "attend over packed sequences with FlashMask",
}
"""Model switches that act only on a CUDA build of Paddle: -> what they would do."""

MODEL_CONFIG_SWITCHES = ("use_fused_rms_norm", "use_fused_rope")
"""The GPU-only switches PaddleNLP's model config implements (set on the config on a CUDA build)."""

_logged_switches = set()


def gpu_switch_overrides(model_args, cuda=None):
    """Config overrides of the GPU-only switches that are on. A CPU build logs once per
    switch that it does nothing here; a CUDA build sets the model-config ones and refuses
    the ones no code here implements."""
    import paddle

    cuda = paddle.is_compiled_with_cuda() if cuda is None else cuda
    overrides = {}
    if getattr(model_args, "use_flash_attention", False) and not cuda and "use_flash_attention" not in _logged_switches:
        _logged_switches.add("use_flash_attention")
        logger.warning("use_flash_attention: this is a CPU build of Paddle; attention runs Paddle's CPU kernels (no flash attention)")
    for name, does in GPU_ONLY_SWITCHES.items():
        if not getattr(model_args, name, False):
            continue
        if not cuda:
            if name not in _logged_switches:
                _logged_switches.add(name)
                logger.warning(f"{name}: this is a CPU build of Paddle, so it does nothing here (on a GPU it would {does})")
        elif name in MODEL_CONFIG_SWITCHES:
            overrides[name] = True
        else:
            raise ValueError(f"{name} ({does}) is not implemented by the trainers here; set it to false")
    return overrides


PIPELINE_ENTRY_POINTS = ("sft", "rm", "dpo", "ppo")
"""Entry points that train pipeline-parallel models (`ppo.strategy.pipeline.pipe`)."""


def load_overrides(model_args, training_args, pipeline_entry=None):
    """Config overrides every model of a run is loaded with: flash attention, recompute
    settings, GPU-only fused kernels, the train patch (`use_train_patch`: installed on a CPU
    build, fused kernels on CUDA) and, with tensor parallelism, this rank's shard
    (PaddleNLP's `tensor_parallel_*` config). `pipeline_parallel_degree > 1` is refused
    unless `pipeline_entry` names an entry point of `PIPELINE_ENTRY_POINTS`, which loads
    pipeline models itself."""
    overrides = {
        "use_flash_attention": model_args.use_flash_attention,
        "recompute_granularity": model_args.recompute_granularity,
        "recompute_use_reentrant": model_args.recompute_use_reentrant,
    }
    if training_args.recompute:
        overrides["recompute"] = True
    overrides.update(gpu_switch_overrides(model_args))
    overrides.update(patch_overrides(model_args.use_train_patch, dtype=training_dtype(training_args)))
    if getattr(training_args, "sequence_parallel", False):
        raise ValueError(
            "sequence_parallel (split activations along the sequence between tensor-parallel ranks) is not implemented by "
            "the trainers here: the log-prob path and the rollout engine take whole sequences; set it false"
        )
    if getattr(training_args, "pipeline_parallel_degree", 1) > 1 and pipeline_entry not in PIPELINE_ENTRY_POINTS:
        raise ValueError(
            f"pipeline_parallel_degree {training_args.pipeline_parallel_degree}: this loads plain models; the training "
            "entry points (sft/run_sft.py, rm/run_reward.py, dpo/run_dpo.py, ppo/run_ppo.py) load pipeline models "
            f"themselves (pipeline_entry {pipeline_entry!r} is none of {PIPELINE_ENTRY_POINTS})"
        )
    if training_args.tensor_parallel_degree > 1:
        overrides.update(
            tensor_parallel_degree=training_args.tensor_parallel_degree,
            tensor_parallel_rank=training_args.tensor_parallel_rank,
            tensor_parallel_output=False,
        )
    return overrides


def enable_recompute(model, granularity="full", use_reentrant=False):
    """Activation recompute in `model`'s decoder (as PaddleNLP's Trainer does for `recompute`):
    the layers that support it recompute their activations in the backward pass at
    `granularity` (full | full_attn | core_attn). Returns how many layers were switched on."""
    switched = 0
    for layer in [model, *model.sublayers()]:
        config = getattr(layer, "config", None)
        if config is not None and hasattr(config, "recompute"):
            config.recompute = True
            config.recompute_granularity = granularity
            config.recompute_use_reentrant = use_reentrant
        if hasattr(layer, "enable_recompute"):
            layer.enable_recompute = True
            if hasattr(layer, "recompute_granularity"):
                layer.recompute_granularity = granularity
            switched += 1
    if not switched:
        raise ValueError(f"{type(model).__name__} has no layers that support recompute")
    return switched


def load_reference(policy, policy_path, ref_path=None, dtype="float32", **overrides):
    """A frozen reference model, or None when `policy` is a LoRA model whose disabled
    adapter serves as the reference (one copy of the base weights)."""
    if is_lora_model(policy) and (not ref_path or ref_path == policy_path):
        if policy.lora_config.trainable_modules:
            raise ValueError(
                f"{policy_path}: the LoRA adapter also trains whole weights {policy.lora_config.trainable_modules} "
                "(lora_trainable_modules); the reference is the policy with its adapter off, and those weights would move "
                "the reference too. Set a separate reference model, or train a fresh adapter without lora_trainable_modules "
                "(an adapter given as the model with use_lora is merged first in PPO/GRPO and DPO)"
            )
        return None
    reference = freeze(set_dropout_off(load_causal_lm(ref_path or policy_path, dtype=dtype, **overrides)))
    if is_lora_model(reference):
        reference.merge()
    return reference


def merge_lora_to_dir(lora_dir, output_dir, base_model_name_or_path=None):
    """Merge a LoRA adapter (causal LM or score model, see `ppo.models.adapters`) into its
    base weights and save a plain model directory (weights and tokenizer) that
    `from_pretrained` loads. `base_model_name_or_path` overrides the causal-LM adapter's base."""
    from .adapters import is_score_adapter, merge_adapter_to_dir, merge_lora_model

    if base_model_name_or_path is None or is_score_adapter(lora_dir):
        if base_model_name_or_path is not None:
            raise ValueError(f"{lora_dir}: base_model_name_or_path overrides only a causal-LM adapter's base")
        return merge_adapter_to_dir(lora_dir, output_dir)
    merged = merge_lora_model(load_causal_lm(lora_dir, base_model_name_or_path=base_model_name_or_path))
    merged.save_pretrained(output_dir)
    load_tokenizer(lora_dir).save_pretrained(output_dir)
    return merged
