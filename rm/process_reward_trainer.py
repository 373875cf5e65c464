"""Process-reward-model training (`rm/run_reward.py --process_reward true`, PaddleNLP's name) on
the PaddleNLP `Trainer`: the score model's score at each step's placeholder token is trained
with the step loss of `ppo/algos/process_reward.py` on `ProcessRewardDataset` batches, and
evaluated by step accuracy on the held-out steps."""
import paddle

from ppo.algos import process_reward_loss
from rm.reward_trainer import RewardTrainer


def step_logits(model, inputs):
    """The score at every step's placeholder: `[B, S]` (garbage where `step_mask` is 0)."""
    out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    return paddle.take_along_axis(out.scores, inputs["step_positions"], axis=1)


def process_loss(model, inputs):
    """`(loss, stats)` of one step-labelled batch with `prm/{loss,step_accuracy,positive_frac}`."""
    return process_reward_loss(step_logits(model, inputs), inputs["step_labels"], inputs["step_mask"])


def step_metrics(logits, labels, mask):
    """Evaluation numbers (floats) from the concatenated steps: `prm/step_accuracy`, the accuracy on
    good and on bad steps, `prm/response_accuracy` (every step of a response right), `prm/eval_loss`."""
    loss, stats = process_reward_loss(logits, labels, mask)
    m = mask.astype("float32")
    right = ((logits > 0) == (labels > 0.5)).astype("float32") * m
    good, bad = labels * m, (1.0 - labels) * m
    whole = paddle.sum(right, axis=1) == paddle.sum(m, axis=1)
    return {
        "prm/step_accuracy": float(stats["prm/step_accuracy"]),
        "prm/good_step_accuracy": float(paddle.sum(right * good) / paddle.clip(paddle.sum(good), min=1.0)),
        "prm/bad_step_accuracy": float(paddle.sum(right * bad) / paddle.clip(paddle.sum(bad), min=1.0)),
        "prm/response_accuracy": float(whole.astype("float32").mean()),
        "prm/eval_loss": float(loss),
        "prm/eval_steps": float(paddle.sum(m)),
    }


def evaluate_steps(model, dataloader, prepare):
    """`step_metrics` over every batch of `dataloader` (steps padded to the longest batch)."""
    parts = ([], [], [])
    with paddle.no_grad():
        for inputs in dataloader:
            inputs = prepare(inputs)
            for part, value in zip(parts, (step_logits(model, inputs), inputs["step_labels"], inputs["step_mask"])):
                part.append(value)
    width = max(x.shape[1] for x in parts[0])
    return step_metrics(*[paddle.concat([_pad_columns(x.astype("float32"), width) for x in part]) for part in parts])


def _pad_columns(x, width):
    """`x [B, S]` padded with zeros to `[B, width]`."""
    if x.shape[1] == width:
        return x
    return paddle.concat([x, paddle.zeros([x.shape[0], width - x.shape[1]], dtype=x.dtype)], axis=1)


class ProcessRewardTrainer(RewardTrainer):
    """`RewardTrainer` (saving, resume) with the step loss and step-accuracy evaluation.
    Packing and pipeline parallelism are refused for process rewards at start-up."""

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, stats = process_loss(model, inputs)
        loss = self.add_moe_aux_loss(model, loss)  # an MoE backbone's router losses
        return (loss, stats) if return_outputs else loss

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """`prm/step_accuracy` (and per good / bad step, per response, the loss) over the eval set."""
        self.model.eval()
        metrics = evaluate_steps(self.model, self.get_eval_dataloader(eval_dataset), self._prepare_inputs)
        self.model.train()
        self.log(metrics)
        return metrics
