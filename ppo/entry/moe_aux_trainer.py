"""A mixture-of-experts model's router losses in a PaddleNLP `Trainer` whose loss is computed
from the model's outputs (SFT, distillation, the DPO family's `Trainer` path, reward models).

The MoE causal LM and score model keep the weighted router loss of their last forward
(`ppo.models.families.moe.take_aux_loss`: ``router_aux_loss_coef`` x the load-balancing loss +
``router_z_loss_coef`` x the z-loss, with ``output_router_logits``); `add_moe_aux_loss` adds it
to the micro-batch's loss, and every training log carries the means of the ``moe/*`` stats since
the last one. A model without routers, or a forward without gradients, adds nothing. The RL
actor's update does the same in `ppo.passes.plain`. Under fleet's hybrid optimiser (tensor
parallel with data parallel or sharding) each micro-step ends with `fill_unreached_before_sync`:
an expert no token of this rank reached gets a zero gradient where another rank's tokens reached
it, so that the fused all-reduce sees the same buffers on every rank."""
from ppo.models.basics import unwrap_model
from ppo.models.families.moe import StatsMean, take_aux_loss

def has_experts(model):
    """Whether `model` is of a mixture-of-experts family (`ppo.common.model_families`)."""
    from ppo.common.model_families import FAMILIES

    family = FAMILIES.get(getattr(getattr(unwrap_model(model), "config", None), "model_type", None))
    return bool(family and family.moe)


class MoeAuxLossMixin:
    """`add_moe_aux_loss(model, loss)` for `compute_loss`, and `log` adding the ``moe/*`` means."""

    def add_moe_aux_loss(self, model, loss):
        """`loss` plus the router losses of the model's last forward, their stats kept for the log."""
        aux, stats = take_aux_loss(unwrap_model(model))
        if aux is None:
            return loss
        if not hasattr(self, "moe_stats"):
            self.moe_stats = StatsMean()
        self.moe_stats.add(stats)
        return loss + aux.astype(loss.dtype)

    def training_step(self, model, *args, **kwargs):
        loss = super().training_step(model, *args, **kwargs)
        if has_experts(model):
            from ppo.strategy.grad_sync import fill_unreached_before_sync

            fill_unreached_before_sync(self.optimizer)
        return loss

    def log(self, logs, **kwargs):
        if "loss" in logs and hasattr(self, "moe_stats"):  # a training log: the router stats since the last
            logs = {**logs, **self.moe_stats.take()}
        super().log(logs, **kwargs)
