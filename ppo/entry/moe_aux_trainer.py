"""A mixture-of-experts model's router losses in a PaddleNLP `Trainer` whose loss is computed
from the model's outputs (SFT, distillation, the DPO family's `Trainer` path, reward models).

The MoE causal LM and score model keep the weighted router loss of their last forward
(`ppo.models.families.moe.take_aux_loss`: ``router_aux_loss_coef`` x the load-balancing loss +
``router_z_loss_coef`` x the z-loss, with ``output_router_logits``); `add_moe_aux_loss` adds it
to the micro-batch's loss, and every training log carries the means of the ``moe/*`` stats since
the last one. A model without routers, or a forward without gradients, adds nothing. The RL
actor's update does the same in `ppo.passes.plain`."""
from ppo.models.basics import unwrap_model
from ppo.models.families.moe import StatsMean, take_aux_loss


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

    def log(self, logs, **kwargs):
        if "loss" in logs and hasattr(self, "moe_stats"):  # a training log: the router stats since the last
            logs = {**logs, **self.moe_stats.take()}
        super().log(logs, **kwargs)
