"""Reward-model training on the PaddleNLP `Trainer` with the pairwise losses of
`ppo/algos/preference.py`, and evaluation of pairwise accuracy and margin."""
import paddle
from paddlenlp.trainer import Trainer

from ppo.algos import pairwise_reward_loss, tokenwise_pairwise_reward_loss
from ppo.models.tensor_parallel import DatasetOrderMixin

LOSS_TYPES = ("sequence-wise", "token-wise")


def score_pairs(model, inputs):
    """One forward over better and worse sequences stacked to `[2B, T]`.

    Returns `(better_output, worse_output, batch_size)` with `scores [B, T]`, `end_scores [B]`.
    """
    B = inputs["better_input_ids"].shape[0]
    input_ids = paddle.concat([inputs["better_input_ids"], inputs["worse_input_ids"]], axis=0)
    attention_mask = paddle.concat([inputs["better_attention_mask"], inputs["worse_attention_mask"]], axis=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    return out.scores, out.end_scores, B


def reward_loss(model, inputs, loss_type, regularization):
    """`(loss, stats)` of one preference batch with `rm/loss`, `rm/accuracy`, `rm/margin`."""
    scores, end_scores, B = score_pairs(model, inputs)
    if loss_type == "sequence-wise":
        return pairwise_reward_loss(end_scores[:B], end_scores[B:], regularization=regularization)
    if loss_type == "token-wise":
        return tokenwise_pairwise_reward_loss(
            scores[:B],
            scores[B:],
            inputs["better_input_ids"],
            inputs["worse_input_ids"],
            inputs["better_attention_mask"],
            inputs["worse_attention_mask"],
            regularization=regularization,
        )
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


class RewardTrainer(DatasetOrderMixin, Trainer):
    """`Trainer` for score models on `PreferenceDataset` batches."""

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, stats = reward_loss(model, inputs, self.args.loss_type, self.args.regularization)
        return (loss, stats) if return_outputs else loss

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Pairwise accuracy and margin over the whole eval set (`rm/accuracy`, `rm/margin`, `rm/eval_loss`)."""
        dataloader = self.get_eval_dataloader(eval_dataset)
        self.model.eval()
        correct, margin, loss_sum, pairs = 0.0, 0.0, 0.0, 0
        with paddle.no_grad():
            for inputs in dataloader:
                inputs = self._prepare_inputs(inputs)
                _, end_scores, B = score_pairs(self.model, inputs)
                diff = end_scores[:B] - end_scores[B:]
                correct += float((diff > 0).astype("float32").sum())
                margin += float(diff.sum())
                loss_sum += float(-paddle.nn.functional.log_sigmoid(diff).sum())
                pairs += B
        self.model.train()
        metrics = {"rm/accuracy": correct / pairs, "rm/margin": margin / pairs, "rm/eval_loss": loss_sum / pairs}
        self.log(metrics)
        return metrics
