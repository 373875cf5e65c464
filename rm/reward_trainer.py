"""Reward-model training on the PaddleNLP `Trainer` with the pairwise losses of
`ppo/algos/preference.py`, and evaluation of pairwise accuracy and margin."""
import paddle
from paddlenlp.trainer import Trainer

from ppo.models.adapters import save_normalizer_stats
from ppo.models.score_model import LOSS_TYPES, pair_scores_loss  # noqa: F401 (LOSS_TYPES: rm/run_reward.py)
from ppo.entry.moe_aux_trainer import MoeAuxLossMixin
from ppo.entry.streaming_trainer import StreamingTrainerMixin
from ppo.entry.trainer_resume import FreshOptimizerResumeMixin
from ppo.strategy import trainer_strategy
from ppo.strategy.data_order import DatasetOrderMixin
from ppo.models.unpadded import pack_padded


def score_pairs(model, inputs, packed_length=None):
    """One forward over better and worse sequences stacked to `[2B, T]`; with `packed_length`
    (`zero_padding`) over their real tokens packed into rows of at most that many tokens
    (`ppo.models.unpadded`), the scores gathered back to `[2B, T]` (0 on padding).

    Returns `(scores [2B, T], end_scores [2B], B)`, the better rows first.
    """
    B = inputs["better_input_ids"].shape[0]
    input_ids = paddle.concat([inputs["better_input_ids"], inputs["worse_input_ids"]], axis=0)
    attention_mask = paddle.concat([inputs["better_attention_mask"], inputs["worse_attention_mask"]], axis=0)
    if not packed_length:
        out = model(input_ids=input_ids, attention_mask=attention_mask)
        return out.scores, out.end_scores, B
    packed = pack_padded(input_ids, attention_mask, capacity=packed_length)
    out = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=packed.position_ids,
                ends=packed.ends)
    return packed.to_padded(out.scores), out.end_scores, B


def reward_loss(model, inputs, loss_type, regularization, packed_length=None):
    """`(loss, stats)` of one preference batch with `rm/loss`, `rm/accuracy`, `rm/margin`."""
    scores, end_scores, B = score_pairs(model, inputs, packed_length)
    return pair_scores_loss(
        scores, end_scores, inputs["better_input_ids"], inputs["worse_input_ids"], inputs["better_attention_mask"],
        inputs["worse_attention_mask"], loss_type, regularization,
    )


class RewardTrainer(MoeAuxLossMixin, StreamingTrainerMixin, FreshOptimizerResumeMixin, DatasetOrderMixin, Trainer):
    """`Trainer` for score models on `PreferenceDataset` batches. Under pipeline parallelism
    the model is a stage of `ppo.strategy.pipeline.score_pipe`, whose last stage computes the loss
    (`PairwiseRewardCriterion`) in the `Trainer`'s pipeline steps, and evaluation scores the
    pairs through the pipeline (`trainer_layout.pair_end_scores`; `trainer_layout`: the run's
    `ppo.strategy.trainer_strategy(args)`, its default). `packed_length` (`zero_padding`): each
    batch's sequences run packed into rows of at most that many tokens (see `score_pairs`)."""

    def __init__(self, *args, packed_length=None, trainer_layout=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.packed_length = packed_length
        self.trainer_layout = trainer_layout or trainer_strategy(self.args)

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, stats = reward_loss(model, inputs, self.args.loss_type, self.args.regularization, self.packed_length)
        loss = self.add_moe_aux_loss(model, loss)  # an MoE backbone's router losses (none without gradients)
        return (loss, stats) if return_outputs else loss

    def _save(self, output_dir=None, state_dict=None, merge_tensor_parallel=False):
        """The `Trainer`'s save, plus a LoRA score model's normaliser statistics (not among
        the adapter's trainable weights) in `score_normalizer.json`."""
        super()._save(output_dir, state_dict=state_dict, merge_tensor_parallel=merge_tensor_parallel)
        if self.args.should_save:
            save_normalizer_stats(self.model, output_dir or self.args.output_dir)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Pairwise accuracy and margin over the whole eval set (`rm/accuracy`, `rm/margin`, `rm/eval_loss`)."""
        dataloader = self.get_eval_dataloader(eval_dataset)
        self.model.eval()
        correct, margin, loss_sum, pairs = 0.0, 0.0, 0.0, 0
        with paddle.no_grad():
            for inputs in dataloader:
                inputs = self._prepare_inputs(inputs)
                scored = self.trainer_layout.pair_end_scores(self, inputs)  # None: the model scores them whole
                end_scores, B = scored if scored is not None else score_pairs(self.model, inputs, self.packed_length)[1:]
                diff = end_scores[:B] - end_scores[B:]
                correct += float((diff > 0).astype("float32").sum())
                margin += float(diff.sum())
                loss_sum += float(-paddle.nn.functional.log_sigmoid(diff).sum())
                pairs += B
        self.model.train()
        metrics = {"rm/accuracy": correct / pairs, "rm/margin": margin / pairs, "rm/eval_loss": loss_sum / pairs}
        self.log(metrics)
        return metrics
