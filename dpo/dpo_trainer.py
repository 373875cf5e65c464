"""The preference-loss family on the PaddleNLP `Trainer`: every `loss_type` of
`ppo.algos.PREFERENCE_LOSSES` (the DPO family on pairs, RRHF / LiPO / PRO / DRO on ranked
lists, KTO / BCO on unpaired labels, NPO on rejected answers), chosen by the registry's facts.

One training step on a batch of B prompts with K answers each (pairs: K = 2):

1. every answer sequence of the batch is stacked to `[B * K, T]` (answer-major: a pair
   batch is its chosen rows, then its rejected rows) and goes through the policy in one
   forward; sequence log-prob = sum over answer tokens of
   `log_softmax(logits[:, :-1])` at `labels[:, 1:]` (answer = `labels != -100`);
2. the reference log-probs come from one more forward without gradients (when the loss's
   `needs_reference` fact says so): through a frozen reference model, or through the policy
   itself with its LoRA adapter disabled (`use_lora`: one copy of the base weights);
3. the registry loss (`dpo.preference_objective`; logged as `loss/dpo`, its own NLL term
   included) times `pref_loss_ratio`, plus `sft_loss_ratio * NLL` of the chosen / best /
   desirable answers (token mean, `loss/sft`) when asked;
   A mixture-of-experts policy adds its router losses of step 1's forward
   (`ppo.models.families.moe.take_aux_loss`: `router_aux_loss_coef` x the load-balancing loss,
   as `SFTTrainer` and the RL actor do) and logs `moe/*`;
4. the detached statistics are summed on device and averaged into the next
   Trainer log (one host transfer per log, reduced across ranks there).

KTO trains on unpaired examples: every pair gives one desirable (chosen) and one
undesirable (rejected) example, as TRL converts paired data. The KL reference
point z0 is TRL's estimate: the policy/reference log-ratio on mismatched
(prompt, completion) pairs built by `KTOCollator` (each prompt with the completion
of the previous example of the batch), computed without gradients, averaged
over the batch and clipped at 0, then averaged across ranks. KTO has no pairwise
accuracy of its own; `rewards/accuracies` compares the two examples of each pair.
"""

import numpy as np
import paddle
import paddle.distributed as dist
from paddlenlp.trainer import Trainer

from dpo.preference_objective import needs_reference, preference_objective
from ppo.algos import PREFERENCE_LOSSES, get_preference_loss, kto_kl_reference_point, masked_sum
from ppo.data import IGNORE_INDEX, right_padding
from ppo.evaluation import LONG_ANSWER_LEN
from ppo.evaluation.trainer_mixin import GenerationEvalMixin
from ppo.models.basics import unwrap_model
from ppo.models.causal_lm import DEFAULT_LOGPROB_CHUNK_SIZE, causal_lm_token_logprobs
from ppo.models.families.moe import take_aux_loss
from ppo.models.unpadded import pack_padded, packed_token_logprobs
from ppo.models.loading import find_lora_model, lora_disabled
from ppo.entry.streaming_trainer import StreamingTrainerMixin
from ppo.entry.trainer_resume import FreshOptimizerResumeMixin
from ppo.strategy import trainer_strategy
from ppo.strategy.data_order import DatasetOrderMixin

LOSS_TYPES = tuple(PREFERENCE_LOSSES)
__all__ = ["LOSS_TYPES", "DPOTrainer", "KTOCollator", "answer_logprobs", "needs_reference"]


class KTOCollator:
    """`PreferenceCollator` output plus the mismatched pairs of KTO's KL reference point.

    The 2B examples of a batch are ordered chosen then rejected; example j gets the
    completion of example j-1 (cyclically), so for B >= 2 no KL pair keeps its own
    prompt. Adds `kl_input_ids`, `kl_attention_mask`, `kl_labels` `[2B, T_kl]`
    (right-padded, labels -100 on prompt and padding); a prompt + completion longer
    than `max_length` has its completion cut.
    """

    def __init__(self, base_collator, max_length=None):
        self.base = base_collator
        self.max_length = max_length

    @staticmethod
    def _split(ids, labels):
        answer = labels != IGNORE_INDEX
        start = int(np.argmax(answer)) if answer.any() else len(ids)
        return ids[:start], ids[start:]

    @staticmethod
    def examples(samples):
        """`(input_ids, labels)` of the batch's examples in row order (chosen rows, then rejected)."""
        return [(s[f"{side}_input_ids"], s[f"{side}_labels"]) for side in ("better", "worse") for s in samples]

    def __call__(self, samples):
        batch = self.base(samples)
        parts = [self._split(ids, labels) for ids, labels in self.examples(samples)]
        ids, labels = [], []
        for j, (prompt, _) in enumerate(parts):
            answer = parts[j - 1][1]
            if self.max_length is not None:
                answer = answer[: max(self.max_length - len(prompt), 0)]
            ids.append(np.concatenate([prompt, answer]))
            labels.append(np.concatenate([np.full(len(prompt), IGNORE_INDEX), answer]))
        pad = self.base.pad_token_id
        batch["kl_input_ids"] = self.base._tensor(right_padding(ids, pad))
        batch["kl_attention_mask"] = self.base._tensor(right_padding([np.ones(len(x)) for x in ids], 0))
        batch["kl_labels"] = self.base._tensor(right_padding(labels, IGNORE_INDEX))
        return batch


class UnpairedKTOCollator(KTOCollator):
    """`KTOCollator` over unpaired examples (`AnswerSetCollator` batches with one answer per
    prompt): example j gets the completion of example j-1, cyclically."""

    @staticmethod
    def examples(samples):
        return [(s["input_ids"][0], s["labels"][0]) for s in samples]


def answer_logprobs(model, input_ids, attention_mask, labels, chunk_size=DEFAULT_LOGPROB_CHUNK_SIZE, packed_length=None):
    """Per-sequence summed answer log-probs `[N]`, answer lengths `[N]`, and the
    per-token log-probs `[N, T-1]` with their mask (for the NLL term). The LM head runs over
    the answer tokens only, `chunk_size` at a time (0: full logits). `packed_length`
    (`zero_padding`): the rows' real tokens run packed into rows of at most that many tokens
    (`ppo.models.unpadded`), with the same results."""
    if packed_length:
        packed = pack_padded(input_ids, attention_mask, capacity=packed_length)
        tok = packed_token_logprobs(model, packed, labels != IGNORE_INDEX, chunk_size=chunk_size)[0][:, 1:]
    else:
        tok, _ = causal_lm_token_logprobs(model, input_ids, attention_mask, labels, chunk_size=chunk_size)
    mask = labels[:, 1:] != IGNORE_INDEX
    return masked_sum(tok, mask, axis=-1), mask.astype("float32").sum(axis=-1), tok, mask


def answer_rows(inputs, data):
    """`(input_ids, attention_mask, labels)` `[N, T]` of a batch's answers, answer-major (a pair
    batch, `data` "pairs": chosen rows then rejected rows), and its `(scores, valid)` `[B, K]`
    (None for pairs)."""
    if data != "pairs":
        return inputs["input_ids"], inputs["attention_mask"], inputs["labels"], inputs["scores"], inputs["valid"]
    keys = ("input_ids", "attention_mask", "labels")
    rows = [paddle.concat([inputs[f"better_{k}"], inputs[f"worse_{k}"]], axis=0) for k in keys]
    return (*rows, None, None)


class DPOTrainer(StreamingTrainerMixin, FreshOptimizerResumeMixin, DatasetOrderMixin, GenerationEvalMixin, Trainer):
    """`Trainer` for the DPO family on `PreferenceDataset` batches (`KTOCollator` for KTO).

    `ref_model`: a frozen reference model, or None (LoRA policy with the adapter
    disabled, or a loss that needs no reference). `eval_prompt_dataset` (a
    `PromptOnlyDataset` with reference answers) adds greedy exact-match metrics to
    every evaluation, as in `SFTTrainer`. `packed_length` (`zero_padding`): every answer
    log-prob pass runs packed into rows of at most that many tokens (see `answer_logprobs`).
    `trainer_layout`: the run's `ppo.strategy.trainer_strategy(args)` (its default); its
    `preference_run` is the evaluation's path through the models (`layout_run`: whole models, or
    under pipeline parallelism the pipes).
    """

    def __init__(
        self,
        *args,
        ref_model=None,
        eval_prompt_dataset=None,
        eval_max_new_tokens=16,
        eval_long_answer_len=LONG_ANSWER_LEN,
        use_rollout_engine=True,
        packed_length=None,
        trainer_layout=None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.ref_model = ref_model
        self.packed_length = packed_length
        self.loss_fn = get_preference_loss(self.args.loss_type)
        self.use_reference = needs_reference(self.args.loss_type, self.args.reference_free)
        if self.use_reference and ref_model is None and find_lora_model(self.model) is None:
            raise ValueError(f"loss_type {self.args.loss_type!r} needs a ref_model or a LoRA policy")
        if ref_model is not None:
            ref_model.eval()
            for p in ref_model.parameters():
                p.stop_gradient = True
        self.setup_generation_eval(eval_prompt_dataset, eval_max_new_tokens, eval_long_answer_len, use_rollout_engine)
        self._stat_sums, self._stat_count = {}, 0
        self.trainer_layout = trainer_layout or trainer_strategy(self.args)
        # the path through the layout's models (whole: this trainer's preference_loss; a pipeline's PreferencePipelineRun)
        self.layout_run = self.trainer_layout.preference_run(self, self.preference_objective, self.record_stats,
                                                               self.rank_mean_kl_point, self.use_reference, self.loss_fn.kl_point)

    # ---- log-probs -------------------------------------------------------

    def answer_logprobs(self, model, input_ids, attention_mask, labels):
        """`answer_logprobs` with this run's `logprob_chunk_size` and packing (`zero_padding`)."""
        return answer_logprobs(model, input_ids, attention_mask, labels, self.args.logprob_chunk_size, self.packed_length)

    def reference_logprobs(self, model, input_ids, attention_mask, labels):
        """Summed answer log-probs `[N]` under the reference, without gradients."""
        with paddle.no_grad():
            if self.ref_model is not None:
                return self.answer_logprobs(self.ref_model, input_ids, attention_mask, labels)[0]
            with lora_disabled(model) as lora_model:
                return self.answer_logprobs(lora_model, input_ids, attention_mask, labels)[0]

    def kl_reference_point(self, model, inputs):
        """KTO's z0 from the batch's mismatched pairs (no gradients), averaged across ranks."""
        ids, mask, labels = inputs["kl_input_ids"], inputs["kl_attention_mask"], inputs["kl_labels"]
        with paddle.no_grad():
            policy_kl = self.answer_logprobs(model, ids, mask, labels)[0]
        return self.rank_mean_kl_point(policy_kl, self.reference_logprobs(model, ids, mask, labels))

    def rank_mean_kl_point(self, policy_kl, reference_kl):
        """`kto_kl_reference_point` of summed log-probs `[N]`, averaged across ranks (every
        rank of a pipeline group holds the same value, so this is the data-parallel mean)."""
        z0 = kto_kl_reference_point(policy_kl, reference_kl)
        if self.args.world_size > 1:
            z0 = z0.clone()
            dist.all_reduce(z0)
            z0 = paddle.clip(z0 / self.args.world_size, min=0.0)
        return z0

    # ---- loss ------------------------------------------------------------

    def preference_loss(self, model, inputs):
        """`(loss, stats)` of one preference batch; stats are detached scalars."""
        ids, mask, labels, scores, valid = answer_rows(inputs, self.loss_fn.data)
        # 1. policy: one forward over every answer of the batch [N, T]
        logps, lengths, _, _ = self.answer_logprobs(model, ids, mask, labels)
        aux, moe_stats = take_aux_loss(unwrap_model(model))  # an MoE policy's router losses (None without gradients)
        # 2. reference: one forward without gradients
        ref = self.reference_logprobs(model, ids, mask, labels) if self.use_reference else None
        kl_point = self.kl_reference_point(model, inputs) if self.loss_fn.kl_point else None
        loss, stats = self.preference_objective(logps, lengths, ref, kl_point, scores, valid)
        if aux is not None:
            loss, stats = loss + aux.astype(loss.dtype), {**stats, **moe_stats}
        return loss, stats

    def preference_objective(self, logps, lengths, ref, kl_point=None, scores=None, valid=None):
        """`(loss, stats)` from summed answer log-probs `[N]` (answer-major rows; pairs: chosen
        rows first), answer lengths `[N]`, the reference's log-probs `[N]` (None without a
        reference), KTO's KL reference point (a scalar) and, off pairs, `scores`/`valid` `[B, K]`:
        `dpo.preference_objective.preference_objective` with this run's arguments."""
        return preference_objective(self.args, logps, lengths, ref, kl_point, scores, valid)

    def compute_loss(self, model, inputs, return_outputs=False):
        loss, stats = self.preference_loss(model, inputs)
        if model.training:
            self.record_stats(stats)
        return (loss, stats) if return_outputs else loss

    def record_stats(self, stats):
        """Add one training micro-batch's statistics to the sums of the next log."""
        for name, value in stats.items():
            value = value.astype("float32").reshape([])
            self._stat_sums[name] = self._stat_sums[name] + value if name in self._stat_sums else value
        self._stat_count += 1

    def reduced_stats(self):
        """Mean of the accumulated statistics since the last log, across ranks; resets them.
        Under pipeline parallelism only the last stage computes them: it sends the means to the
        other stages of its group first (`trainer_layout.last_stage_means`)."""
        means = None
        if self._stat_count:
            names = sorted(self._stat_sums)
            means = (names, paddle.stack([self._stat_sums[n] for n in names]) / self._stat_count)
        means = self.trainer_layout.last_stage_means(means)
        if means is None:
            return {}
        names, vec = means
        if self.args.world_size > 1:
            dist.all_reduce(vec)
            vec = vec / self.args.world_size
        values = vec.numpy().tolist()
        self._stat_sums, self._stat_count = {}, 0
        return dict(zip(names, values))

    def log(self, logs, **kwargs):
        if "loss" in logs:  # a training log: add the accumulated DPO statistics
            logs = {**logs, **self.reduced_stats()}
        super().log(logs, **kwargs)

    # ---- evaluation --------------------------------------------------------

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with paddle.no_grad():
            loss, _ = self.layout_run.preference_loss(inputs, model)
        return loss.detach(), None, None

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Held-out pairs: `eval/preference_accuracy` (implicit reward of the chosen answer
        above the rejected one), `eval/reward_margin`, `eval/loss`, `eval/rewards/{chosen,rejected}`;
        plus greedy exact match (`eval/accuracy`, ...) when there are generation prompts."""
        metrics = {}
        if eval_dataset is not None or self.eval_dataset is not None:
            metrics.update(self.evaluate_pairs(eval_dataset, metric_key_prefix))
        metrics.update(self.generation_metrics())
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def evaluate_pairs(self, eval_dataset=None, prefix="eval"):
        dataloader = self.get_eval_dataloader(eval_dataset)
        was_training = self.model.training
        self.model.eval()
        keys = ("loss/dpo", "rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected")
        names = ("loss", "preference_accuracy", "reward_margin", "rewards/chosen", "rewards/rejected")
        sums = paddle.zeros([len(keys) + 1], "float32")  # prompt-weighted sums, then the prompt count
        present = set()
        with paddle.no_grad():
            for inputs in dataloader:
                inputs = self._prepare_inputs(inputs)
                _, stats = self.layout_run.preference_loss(inputs)
                B = float((inputs["scores"] if "scores" in inputs else inputs["better_input_ids"]).shape[0])
                present.update(k for k in keys if k in stats)
                zero = paddle.zeros([], "float32")
                weighted = [stats.get(k, zero).astype("float32").reshape([]) * B for k in keys]
                sums = sums + paddle.stack(weighted + [paddle.full([], B)])
        if was_training:
            self.model.train()
        if self.args.world_size > 1:
            dist.all_reduce(sums)
        total = sums.numpy().tolist()
        mean = [v / max(total[-1], 1.0) for v in total[:-1]]
        return {f"{prefix}/{n}": v for n, v, k in zip(names, mean, keys) if k in present}
