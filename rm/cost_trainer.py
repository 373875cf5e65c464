"""Cost-model training (Safe RLHF, Dai et al. 2023) on the PaddleNLP `Trainer`: the losses of
`ppo/algos/cost.py` on `SafetyPreferenceDataset` batches (`better_*` = the safer answer,
`worse_*` = the unsafer one, `better_sign`/`worse_sign` = +1 safe / -1 unsafe), and
evaluation of pairwise and sign accuracy. The model is a score model like the reward model
(saved with `score_type: cost`), so PPO loads it with the same loader."""
import paddle

from ppo.algos import pairwise_cost_loss, tokenwise_pairwise_cost_loss
from rm.reward_trainer import RewardTrainer, score_pairs


def cost_loss(model, inputs, loss_type, regularization, packed_length=None):
    """`(loss, stats)` of one safety batch with `cost/{loss,accuracy,sign_accuracy,margin}`
    (`packed_length`: `zero_padding`, see `rm.reward_trainer.score_pairs`)."""
    scores, end_scores, B = score_pairs(model, inputs, packed_length)
    signs = inputs["better_sign"], inputs["worse_sign"]
    if loss_type == "sequence-wise":
        return pairwise_cost_loss(end_scores[:B], end_scores[B:], *signs, regularization=regularization)
    if loss_type == "token-wise":
        return tokenwise_pairwise_cost_loss(
            scores[:B], scores[B:], inputs["better_input_ids"], inputs["worse_input_ids"], inputs["better_attention_mask"],
            inputs["worse_attention_mask"], *signs, regularization=regularization,
        )
    raise ValueError(f"loss_type must be 'sequence-wise' or 'token-wise', got {loss_type!r}")


def end_costs_and_signs(model, dataloader, prepare, packed_length=None):
    """End costs and safety signs of every pair of `dataloader`: `(safer [N], unsafer [N], safer_sign [N], unsafer_sign [N])`."""
    parts = ([], [], [], [])
    with paddle.no_grad():
        for inputs in dataloader:
            inputs = prepare(inputs)
            _, end_scores, B = score_pairs(model, inputs, packed_length)
            for part, value in zip(parts, (end_scores[:B], end_scores[B:], inputs["better_sign"], inputs["worse_sign"])):
                part.append(value)
    return tuple(paddle.concat(p) for p in parts)


def cost_eval_metrics(safer, unsafer, safer_sign, unsafer_sign):
    """`cost/{accuracy,sign_accuracy,margin,eval_loss,mean,std}` (floats) of end costs `[N]` and signs `[N]`
    (`eval_loss`: the sequence-wise loss without regularisation)."""
    loss, stats = pairwise_cost_loss(safer, unsafer, safer_sign, unsafer_sign)
    costs = paddle.concat([safer, unsafer])
    metrics = {key: float(value) for key, value in stats.items() if key != "cost/loss"}
    metrics.update({"cost/eval_loss": float(loss), "cost/mean": float(costs.mean()), "cost/std": float(costs.std())})
    return metrics


class CostTrainer(RewardTrainer):
    """`RewardTrainer` (saving, normaliser statistics, resume) with the cost loss and metrics.
    Pipeline parallelism is refused for cost models at start-up (`rm/reward_arguments.py`)."""

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, stats = cost_loss(model, inputs, self.args.loss_type, self.args.regularization, self.packed_length)
        loss = self.add_moe_aux_loss(model, loss)  # an MoE backbone's router losses
        return (loss, stats) if return_outputs else loss

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Pairwise accuracy (`cost/accuracy`: unsafer costs more), sign accuracy (`cost/sign_accuracy`:
        cost > 0 exactly for unsafe answers), `cost/{margin,eval_loss,mean,std}` over the whole eval set."""
        self.model.eval()
        costs = end_costs_and_signs(self.model, self.get_eval_dataloader(eval_dataset), self._prepare_inputs, self.packed_length)
        self.model.train()
        metrics = cost_eval_metrics(*costs)
        self.log(metrics)
        return metrics
