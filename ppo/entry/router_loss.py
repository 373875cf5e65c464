"""The router losses of a mixture-of-experts model in a PaddleNLP `Trainer` whose loss is
computed from the model's outputs (SFT, reward model): added to the loss, stats logged."""
from ..models.basics import unwrap_model
from ..models.families.moe import StatsMean, take_aux_loss


class RouterLossMixin:
    """`add_moe_aux_loss` for `compute_loss`, and `log` with the ``moe/*`` means since the last log."""

    def add_moe_aux_loss(self, model, loss):
        """`loss` plus the router losses of a mixture-of-experts model's forward (with
        ``output_router_logits``; `ppo.models.families.moe.take_aux_loss`), their stats kept for the log."""
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
