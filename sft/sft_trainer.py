"""Supervised fine-tuning on the PaddleNLP `Trainer`: loss on answer tokens only,
plus held-out exact-match evaluation by greedy generation."""
import paddle
from paddlenlp.trainer import Trainer

from ppo.common.step_tokens import STEP_TOKENS_KEY, count_step_tokens, step_token_scale
from ppo.evaluation import LONG_ANSWER_LEN
from ppo.evaluation.trainer_mixin import GenerationEvalMixin
from ppo.models.causal_lm import answer_nll
from ppo.entry.moe_aux_trainer import MoeAuxLossMixin
from ppo.entry.streaming_trainer import StreamingTrainerMixin
from ppo.entry.trainer_resume import FreshOptimizerResumeMixin
from ppo.strategy import LayoutTrainerMixin, TrainerLayout
from ppo.strategy.data_order import DatasetOrderMixin


class SFTTrainer(MoeAuxLossMixin, LayoutTrainerMixin, StreamingTrainerMixin, FreshOptimizerResumeMixin, DatasetOrderMixin, GenerationEvalMixin,
                 Trainer):
    """`Trainer` whose loss is the masked token-mean NLL of the answer tokens. Under pipeline
    parallelism the model is a pipeline stage whose last stage computes that loss itself
    (`ppo.strategy.pipeline.pipe`); the `Trainer`'s pipeline steps run it. `trainer_layout`:
    the run's `ppo.strategy.trainer_strategy(args)`, whose hooks `LayoutTrainerMixin` calls (the
    expert axis: `ppo.strategy.expert.trainer`); default: the whole-model layout.

    `eval_prompt_dataset` (a `PromptOnlyDataset` with reference answers) adds
    `eval/accuracy`, `eval/accuracy_long`, `eval/accuracy_short` and
    `eval/response_length` to every evaluation.
    """

    def __init__(self, *args, eval_prompt_dataset=None, eval_max_new_tokens=16, eval_long_answer_len=LONG_ANSWER_LEN, use_rollout_engine=True,
                 trainer_layout=None, **kwargs):
        self.trainer_layout = trainer_layout or TrainerLayout(kwargs.get("args"))  # the model as it was given
        super().__init__(*args, **kwargs)
        self.setup_generation_eval(eval_prompt_dataset, eval_max_new_tokens, eval_long_answer_len, use_rollout_engine)

    def get_train_dataloader(self):
        """The Trainer's loader, each batch carrying its optimiser step's answer-token count
        over every data rank (`ppo.common.step_tokens`)."""
        loader = super().get_train_dataloader()
        return count_step_tokens(loader, self.args.gradient_accumulation_steps, self.args.dataset_world_size)

    def compute_loss(self, model, inputs, return_outputs=False):
        """Answer-token NLL: in training, this micro-batch's share of the token mean over the
        whole optimiser step on every data rank (`step_token_scale`), so that data parallelism
        and gradient accumulation change nothing; elsewhere the batch's own token mean."""
        labels = inputs["labels"]
        loss, logprobs = answer_nll(model, inputs["input_ids"], inputs["attention_mask"], labels, self.args.logprob_chunk_size,
                                    position_ids=inputs.get("position_ids"))  # packed rows (zero_padding) carry their own
        if STEP_TOKENS_KEY in inputs:  # training batches carry their step's token count (get_train_dataloader)
            scale = step_token_scale(inputs, self.args.gradient_accumulation_steps, self.args.dataset_world_size)
            # the summed NLL x scale (the pipeline's last stage computes the same)
            loss = -paddle.sum(logprobs * (labels[:, 1:] >= 0).astype(logprobs.dtype)) * scale
            loss = self.add_moe_aux_loss(model, loss)
        return (loss, {"logprobs": logprobs}) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The layout's evaluation step (`TrainerLayout.prediction_step`): the answer-token NLL of
        the whole model, or the `Trainer`'s own step where the model parts compute it (a pipe)."""
        step = self.trainer_layout.prediction_step(self.whole_model_prediction_step, super().prediction_step)
        return step(model, inputs, prediction_loss_only, ignore_keys)

    def whole_model_prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with paddle.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        metrics = {}
        if eval_dataset is not None or self.eval_dataset is not None:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        gen_metrics = self.generation_metrics()
        if gen_metrics:
            self.log(gen_metrics)
            metrics.update(gen_metrics)
        return metrics
