"""`ModelPasses` over models that run whole in each process: one process, data parallel,
sharding and tensor parallel (their wrappers sync gradients inside `backward` / the
optimiser step). No-gradient passes use the unwrapped models in row chunks; the update's
forwards use the wrapped (trained) ones."""
import contextlib

import numpy as np
import paddle

from ..experience.forward import in_chunks, response_logprobs, response_values
from ..models.reward_tokens import reward_scores
from ..models.basics import unwrap_model
from ..models.causal_lm import answer_nll
from ..models.families.moe import take_aux_loss
from ..models.routing_replay import agreement_metric, take_replay_agreement
from .base import ModelPasses


def ptx_nll(model, batch, chunk_size):
    """Token-mean NLL (a scalar) of a supervised batch's answer tokens under `model` (`batch`:
    `input_ids`, `attention_mask`, `labels`, `[m, T]`): PPO's ptx loss."""
    loss, _ = answer_nll(model, batch["input_ids"], batch["attention_mask"], batch["labels"], chunk_size)
    return loss


class PlainPasses(ModelPasses):
    """models: `PPOModels` (unwrapped; `reference_mode()` gives the reference, `score_models()`
    and `critic_models()` each objective's); actor: the trained actor as wrapped for data
    parallel or fleet (the same object on one rank); critics: `{objective: trained critic}`,
    wrapped alike, the first one the critic whose values the kept first forward holds;
    temperature: the log-probs' temperature (the sampling temperature; DPO's own: 1);
    logprob_chunk_size: tokens per LM-head chunk (0: full logits); chunk_rows: rows per
    no-gradient forward, `{"logprob", "value", "reward"}` (PaddleNLP's
    `per_device_<name>_batch_size`) or one number for all three; retokenizers:
    `{objective: tokenizer}` re-encoding the rollouts for a score model whose tokenizer differs
    from the actor's; remove_padding: the actor, reference and critic passes run on the rows'
    real tokens packed together (`use_remove_padding`, `ppo.models.unpadded`); the score
    models' stay padded; logprob_dtype: of the actor's and reference's log-probs (float32, or the
    training dtype with PaddleNLP's `use_fp32_compute` off).

    Routing replay (an experience with `routing`, `moe_routing_replay rollout`): the actor's
    forwards (old log-probs, the update's) use the rollout's experts; the reference keeps its own
    routing, as slime's actor (`fallthrough` for the reference, `replay_forward` for the old
    log-probs, `replay_backward` for training: `slime/backends/megatron_utils/actor.py`). The
    update's micro-batches report `moe/replay_agreement` (`ppo.models.routing_replay`)."""

    def __init__(self, models, actor, critics, temperature, logprob_chunk_size, chunk_rows, *, retokenizers=None,
                 remove_padding=False, logprob_dtype="float32"):
        self.models, self.actor, self.critics = models, actor, dict(critics)
        self.temperature, self.logprob_chunk_size = temperature, logprob_chunk_size
        self.chunk_rows = chunk_rows if isinstance(chunk_rows, dict) else dict.fromkeys(("logprob", "value", "reward"), chunk_rows)
        self.generation_model = models.actor
        self.retokenizers = dict(retokenizers or {})
        self.remove_padding = remove_padding
        self.logprob_dtype = logprob_dtype

    def generation_weights(self):
        return contextlib.nullcontext(self.models.actor)

    # ---- no-gradient passes ----------------------------------------------------------
    def logprobs(self, which, exp):
        if which == "actor":
            logprobs = self._logprobs_under(self.models.actor, exp, replay=True)
            take_replay_agreement(self.models.actor)  # the metric counts the update's forwards only
            return logprobs
        with self.models.reference_mode() as reference:  # a LoRA actor with its adapter off; its own routing
            return self._logprobs_under(reference, exp, replay=False)

    def _logprobs_under(self, model, exp, replay):
        return in_chunks(lambda e: self._actor_forward(model, e, with_entropy=False, replay=replay)[0], exp,
                         self.chunk_rows["logprob"])

    def values(self, objective, exp):
        critic = self.models.critic_models()[objective]
        return in_chunks(lambda e: self._critic_forward(critic, e), exp, self.chunk_rows["value"])

    def _actor_forward(self, model, exp, with_entropy=True, replay=True):
        return response_logprobs(model, exp, self.temperature, self.logprob_chunk_size, with_entropy=with_entropy,
                                 remove_padding=self.remove_padding, dtype=self.logprob_dtype, replay=replay)

    def _critic_forward(self, model, exp):
        return response_values(model, exp, remove_padding=self.remove_padding)

    def scores(self, objective, exp):
        model, retokenizer = self.models.score_models()[objective], self.retokenizers.get(objective)
        return in_chunks(lambda e: reward_scores(model, e, retokenizer), exp, self.chunk_rows["reward"])

    # ---- update ------------------------------------------------------------------
    def first_forward_reusable(self):
        return True

    def first_forward(self, exp):
        return self.training_forward(exp)

    def training_forward(self, mb):
        """The training forward of one micro-batch, with gradients: actor log-probs and entropy
        `[n, Tr]`, the first critic's values `[n, Tr]` (None without a critic)."""
        self.actor.train()
        logprobs, entropy = self._actor_forward(self.actor, mb)
        values = None
        for critic in list(self.critics.values())[:1]:
            critic.train()
            values = self._critic_forward(critic, mb)
        return {"logprobs": logprobs, "entropy": entropy, "values": values}

    @staticmethod
    def gathered(forward, rows):
        """A forward over all rows (`first_forward`) gathered to `rows`; None when there is none."""
        if forward is None:
            return None
        index = paddle.to_tensor(np.asarray(rows, dtype="int64"))
        return {k: (None if v is None else paddle.gather(v, index)) for k, v in forward.items()}

    def backward_step(self, exp, plan, losses, first_forward=None):
        """Per micro-batch: the actor's loss (plus the ptx NLL of one supervised batch) and its
        backward, then each critic's; `first_forward` serves the first micro-batch. With
        `losses.actor` None (value pretraining) the actor runs no pass and its total is 0."""
        actor_total = 0.0
        totals = dict.fromkeys(losses.critics, 0.0)
        records = []
        for index, rows in enumerate(plan):
            mb = exp.select(rows)
            forward = (self.gathered(first_forward, rows) if index == 0 else None) or {"values": None}
            stats = {}
            if losses.actor is not None:
                if "logprobs" not in forward:
                    logprobs, entropy = self._actor_forward(self.actor, mb, with_entropy=losses.with_entropy)
                    forward = {"logprobs": logprobs, "entropy": entropy, "values": None}
                loss, stats = self.actor_backward(mb, forward, losses, len(plan))
                actor_total += loss
            for i, (objective, loss_fn) in enumerate(losses.critics.items()):
                values = forward["values"] if i == 0 and forward["values"] is not None else None
                if values is None:
                    values = self._critic_forward(self.critics[objective], mb)
                router = take_aux_loss(unwrap_model(self.critics[objective]))  # an MoE critic's, of that forward
                stats = {**stats, **self.value_backward(loss_fn, mb, values, totals, objective, router, len(plan))}
            records.append(stats)
        return actor_total, totals, records

    def actor_backward(self, mb, forward, losses, n_micro):
        """Backward of the actor's loss on `forward` (plus the ptx NLL of one supervised batch and
        a mixture-of-experts actor's router losses, each weight split over the step's `n_micro`
        micro-batches); `(loss as a float, stats)`."""
        loss, stats = losses.actor(mb, forward)
        aux, moe_stats = take_aux_loss(unwrap_model(self.actor))  # an MoE actor's router losses
        if aux is not None:
            loss = loss + aux.astype(loss.dtype) / n_micro
            stats = {**stats, **moe_stats}
        stats = {**stats, **agreement_metric(unwrap_model(self.actor))}  # routing replay's, when replayed
        if losses.next_ptx_batch is not None:
            ptx = ptx_nll(self.actor, losses.next_ptx_batch(), self.logprob_chunk_size)
            loss = loss + losses.ptx_coeff * ptx / n_micro
            stats["loss/ptx"] = ptx.detach()
        loss.backward()
        return float(loss), stats

    @staticmethod
    def value_backward(loss_fn, mb, values, totals, name, router=(None, {}), n_micro=1):
        """Backward of one critic's loss on `values` `[n, Tr]` (the value loss added to
        `totals[name]`), plus a mixture-of-experts critic's router losses `router` (`(aux, stats)`
        of `take_aux_loss`, the weight split over the step's `n_micro` micro-batches, the stats
        logged as `moe/<name>_critic_*`); its stats."""
        vloss, vstats = loss_fn(mb, {"values": values})
        aux, moe_stats = router
        (vloss if aux is None else vloss + aux.astype(vloss.dtype) / n_micro).backward()
        totals[name] += float(vloss)
        return {**vstats, **{key.replace("moe/", f"moe/{name}_critic_", 1): v for key, v in moe_stats.items()}}

    def group_sum(self, value):
        return value
