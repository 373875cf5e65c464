"""Optimisers and learning-rate schedules for the actor and the critic."""
import math

import paddle


def lr_factor(kind, step, warmup_steps, total_steps, min_ratio):
    """Multiplier of the peak learning rate at `step` (linear warm-up, then decay to `min_ratio`)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if kind == "linear":
        decay = 1.0 - progress
    elif kind == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"lr scheduler must be constant | linear | cosine, got {kind!r}")
    return min_ratio + (1.0 - min_ratio) * decay


def build_scheduler(kind, learning_rate, min_learning_rate, warmup_ratio, warmup_steps, total_steps):
    """A `LambdaDecay` schedule stepped once per PPO step; its state is `last_epoch`."""
    kind = str(getattr(kind, "value", kind))
    warmup = warmup_steps or int(math.ceil(warmup_ratio * total_steps))
    min_ratio = min_learning_rate / learning_rate if learning_rate else 0.0
    lr_factor(kind, 0, warmup, total_steps, min_ratio)  # validates `kind`
    return paddle.optimizer.lr.LambdaDecay(
        learning_rate, lambda step: lr_factor(kind, step, warmup, total_steps, min_ratio)
    )


class FusedAdamW(paddle.optimizer.AdamW):
    """`paddle.optimizer.AdamW` whose eager `step()` runs the C++ `train_adamw` op (all
    parameters and the global-norm clip in one call) when it can: float32 parameters on the
    CPU, no master weights / lr ratio / lazy mode / AMSGrad, the clip a `ClipGradByGlobalNorm`
    (or none) and the op library loaded. Otherwise, and under fleet's optimizer wrappers (which
    replace the clip), Paddle's own step runs. The state (moments, beta powers) is the parent's,
    so checkpoints are the same either way. `fused_steps` counts the fused steps."""

    def __init__(self, *args, fused=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.fused = fused
        self.fused_steps = 0

    def _fused_reason(self, params):
        from ppo import kernels

        if not self.fused:
            return "off"
        if self._multi_precision or self._lr_ratio is not None or self._lazy_mode or self._amsgrad:
            return "master weights / lr ratio / lazy mode / AMSGrad"
        if self._grad_clip is not None and type(self._grad_clip) is not paddle.nn.ClipGradByGlobalNorm:
            return f"gradient clip {type(self._grad_clip).__name__}"
        if isinstance(self._beta1, paddle.Tensor) or isinstance(self._beta2, paddle.Tensor):
            return "tensor betas"
        if any(p.dtype != paddle.float32 or not p.place.is_cpu_place() for p in params):
            return "non-float32 or non-CPU parameters"
        if not kernels.ops_available():
            return f"ops unavailable: {kernels.unavailable_reason()}"
        return None

    @paddle.no_grad()
    def step(self):
        params = [p for p in self._parameter_list if not p.stop_gradient and p.grad is not None]
        if not params or self._fused_reason(params) is not None or not paddle.in_dynamic_mode():
            return super().step()
        block = paddle.static.default_main_program().global_block()
        self._create_accumulators(block, params)
        acc = self._accumulators
        get = lambda key: [acc[key][p.name] for p in params]  # noqa: E731
        clip = self._grad_clip.clip_norm if self._grad_clip is not None else 0.0
        decay = [int(self._apply_decay_param_fun is None or bool(self._apply_decay_param_fun(p.name))) for p in params]
        # detach(): the same storage without the autograd leaf, which Paddle refuses to update in place
        paddle._C_ops._run_custom_op(
            "train_adamw", [p.detach() for p in params], [p.grad for p in params], get(self._moment1_acc_str), get(self._moment2_acc_str),
            get(self._beta1_pow_acc_str), get(self._beta2_pow_acc_str), float(self.get_lr()), float(self._beta1),
            float(self._beta2), float(self._epsilon), float(self._weight_decay or 0.0), float(clip), decay,
        )
        self.fused_steps += 1


def build_optimizer(model, scheduler, weight_decay, max_grad_norm, beta1, beta2, epsilon, fused=True):
    """AdamW over the trainable parameters, with global-norm gradient clipping; float32
    master weights when the model is in bf16/fp16; `fused`: `FusedAdamW`'s one-op step where
    it applies."""
    params = [p for p in model.parameters() if not p.stop_gradient]
    low_precision = any(p.dtype in (paddle.bfloat16, paddle.float16) for p in params)
    clip = paddle.nn.ClipGradByGlobalNorm(max_grad_norm) if max_grad_norm and max_grad_norm > 0 else None
    decay_names = {p.name for n, p in model.named_parameters() if not any(k in n for k in ("bias", "norm"))}
    return FusedAdamW(
        learning_rate=scheduler,
        parameters=params,
        weight_decay=weight_decay,
        apply_decay_param_fun=lambda name: name in decay_names,
        grad_clip=clip,
        beta1=beta1,
        beta2=beta2,
        epsilon=epsilon,
        multi_precision=low_precision,
        fused=fused,
    )
