"""Pipeline parallelism: the pieces every pipeline model here shares (SFT's pipe here, the
score model in `score_pipe.py`, the DPO family in `preference_pipe.py`, PPO/GRPO in
`policy_pipe.py`).

Under `pipeline_parallel_degree > 1` PaddleNLP's `Trainer` trains a fleet `PipelineLayer`:
each rank builds only its stage's layers, the 1F1B schedule (`forward_backward_pipeline`)
runs `gradient_accumulation_steps` micro-batches of `per_device_train_batch_size` rows, and
the last stage applies the layer's loss function `loss_fn(output, labels)` to each
micro-batch, dividing it by the number of micro-batches. The pieces here:

* `load_pipe(path, ...)`: PaddleNLP's `LlamaForCausalLMPipe` / `Qwen2ForCausalLMPipe`, or
  our families' pipes (`family_pipes`), for a plain checkpoint, with our loss and input
  preparation;
* `AnswerNLLCriterion`: the SFT loss (`ppo.models.causal_lm.answer_nll`) on the last stage's
  logits. PaddleNLP's `LlamaPretrainingCriterion` expects labels already shifted by one
  position; our collators give labels in input alignment (`labels[:, t]` is the token at
  position t, -100 off the answer);
* `CausalLMPipelineInputs`: a collated batch (`input_ids`, `attention_mask`, `labels`) to the
  schedule's `[first-stage inputs, last-stage labels]`, with position ids from the mask;
* `all_stage_states(model)`: every stage's weights (plain keys) on every rank of the group;
* `save_pipeline_merged(model, path)`: them written by the first stage as one plain checkpoint
  (`model_state.pdparams`, the plain model's keys).
"""
import copy
import logging
import os

import paddle
import paddle.distributed as dist

from ...common.step_tokens import step_token_scale
from ...algos import masked_mean, token_logprobs
from ...common.parallel_groups import pipeline_group
from ...models.causal_lm import position_ids_from_mask

logger = logging.getLogger(__name__)

PIPE_CLASSES = {"llama": ("LlamaForCausalLMPipe", "LlamaForCausalLM"), "qwen2": ("Qwen2ForCausalLMPipe", "Qwen2ForCausalLM")}
"""`config.model_type` -> (PaddleNLP pipeline class, plain class the merged checkpoint loads as)."""


def pipe_classes(config):
    """`(pipe class, plain class name)` for a model config; refuses what PaddleNLP 3.0.0b4's
    pipeline classes cannot train here."""
    import paddlenlp.transformers as transformers

    model_type = getattr(config, "model_type", None)
    family = family_pipe(model_type)
    if family is not None:
        return family
    if model_type not in PIPE_CLASSES:
        raise ValueError(
            f"pipeline_parallel_degree > 1: no pipeline class for model_type {model_type!r}; supported: {pipe_model_types()}"
        )
    if model_type == "qwen2" and getattr(config, "tie_word_embeddings", False):
        raise ValueError(
            "pipeline_parallel_degree > 1: PaddleNLP's Qwen2ForCausalLMPipe does not train a model with "
            "tie_word_embeddings=true (e.g. Qwen2.5-0.5B/1.5B) correctly in paddlenlp 3.0.0b4 (its tied LM head differs "
            "from the plain model's); use tensor_parallel_degree or sharding for this model"
        )
    pipe_name, plain_name = PIPE_CLASSES[model_type]
    return getattr(transformers, pipe_name), plain_name


def pipe_model_types():
    """The model types with a pipeline class: PaddleNLP's and the families written here."""
    from ...models.families import FAMILIES

    return sorted(set(PIPE_CLASSES) | {t for t, f in FAMILIES.items() if f.module})


def family_pipe(model_type):
    """`(pipe class, plain class name)` of a family written here (`family_pipes`), None for PaddleNLP's."""
    from ...models.families import family_module

    module = family_module(model_type)
    if module is None:
        return None
    from .family_pipes import family_pipe_class

    return family_pipe_class(module), module.CAUSAL_LM_CLASS.__name__


def plain_class(config):
    """The plain (one-process) causal LM class of a pipe's config: the keys of its merged checkpoint."""
    from ...models.families import family_module

    module = family_module(getattr(config, "model_type", None))
    if module is not None:
        return module.CAUSAL_LM_CLASS
    import paddlenlp.transformers as transformers

    return getattr(transformers, pipe_classes(config)[1])


def install_last_stage_loss(pipe, criterion, prepare_inputs=None):
    """Make `criterion(output, labels)` the loss fleet's schedule computes on `pipe`'s last stage
    and, when given, `prepare_inputs` the `Trainer`'s `_prepare_pipeline_inputs_func`: the one
    place that writes fleet's and PaddleNLP's private pipeline attributes. A pipe carrying a
    mixture of experts' router sums adds the router losses to `criterion`'s
    (`family_moe_pipe.RouterLossCriterion`)."""
    from .family_moe_pipe import RouterLossCriterion, carries_router_sums

    if criterion is not None and carries_router_sums(pipe.config):
        criterion = RouterLossCriterion(criterion, pipe.config)
    pipe._loss_fn = [criterion]
    if prepare_inputs is not None:
        pipe._prepare_pipeline_inputs_func = prepare_inputs


def refuse_hf_dir(path):
    """Pipeline stages load PaddleNLP checkpoints only: refuse a Hugging Face directory, naming the converter."""
    from ...models.hf_files import is_hf_dir

    if is_hf_dir(path):
        raise ValueError(f"pipeline_parallel_degree > 1 with a Hugging Face directory ({path}): convert it first "
                         f"(python scripts/import_hf.py --hf_path {path} --output_dir DIR) and pass DIR")


def load_pipe(path, loss_fn, prepare_inputs, dtype="float32", **config_overrides):
    """This rank's pipeline stage of the causal LM in `path` (a plain checkpoint; PaddleNLP
    maps its keys to the stage's layers), with `loss_fn(output, labels)` as the last stage's
    loss and `prepare_inputs` as the `Trainer`'s `_prepare_pipeline_inputs_func`."""
    from ...models.families import load_config
    from ...models.loading import is_lora_dir

    if is_lora_dir(path):
        raise ValueError(
            f"pipeline_parallel_degree > 1 with a LoRA adapter ({path}): LoRA layers on pipeline stages are not "
            "implemented here; merge the adapter (sft/merge_lora.py) or use tensor_parallel_degree"
        )
    refuse_hf_dir(path)
    pipe_cls, _ = pipe_classes(load_config(path))
    model = pipe_cls.from_pretrained(path, dtype=dtype, **config_overrides)
    install_last_stage_loss(model, loss_fn, prepare_inputs)
    return model


class AnswerNLLCriterion(paddle.nn.Layer):
    """SFT loss on the last stage: `logits [N, T, V]`, `labels [N, T]` in input alignment
    (-100 off the answer) -> the token mean of `-log p(labels[:, t + 1] | tokens <= t)` over the
    answer tokens (scalar, float32), as `ppo.models.causal_lm.answer_nll`.

    `labels` may also be `[labels [N, T], weight [N, 1]]` (evaluation, see
    `CausalLMPipelineInputs`): the loss is then `sum(nll) * weight[0]`, the micro-batch's share
    of the whole batch's token mean."""

    def forward(self, logits, labels):
        if not isinstance(labels, (tuple, list)):
            return answer_nll_from_logits(logits, labels)
        labels, weight = labels
        targets = labels[:, 1:]
        logp = token_logprobs(logits[:, :-1].astype("float32"), targets)  # labels < 0 give 0
        return -paddle.sum(logp) * weight[0, 0]


def answer_nll_from_logits(logits, labels):
    """Token-mean NLL of the counted tokens (`labels [N, T]` >= 0 in input alignment, scored by
    the logits one position earlier) from a last stage's logits `[N, T, V]` (scalar, float32),
    as `ppo.models.causal_lm.answer_nll`."""
    targets = labels[:, 1:]
    return -masked_mean(token_logprobs(logits[:, :-1].astype("float32"), targets), targets >= 0)


def _rows(tensor, index):
    return paddle.index_select(tensor, paddle.to_tensor(index, dtype="int64"), axis=0)


class CausalLMPipelineInputs:
    """The `Trainer`'s `_prepare_pipeline_inputs_func` for batches of `input_ids`,
    `attention_mask` and `labels` (each `[N, T]`).

    Training gives a list of `accumulate_steps` collated micro-batches (each padded to its
    own length): returns `[(input_ids, mask, position_ids), labels]`, each a list with one
    tensor per micro-batch, all right-padded to the longest micro-batch (fleet's 1F1B schedule
    receives a micro-batch's gradient into a buffer shaped like the last activation it sent;
    right padding changes no real token's output under the causal mask). The attention mask goes as bool: PaddleNLP's pipeline embedding
    reads an int32 / int64 second input as FlashMask row indices / position ids on GPU.

    Evaluation (`Trainer.prediction_pipeline_step`) gives one batch: it is cut into
    `accumulate_steps` row groups (the schedule's micro-batches; a group short of rows repeats
    row 0 with weight 0), each labelled `[labels, weight]` with
    `weight = accumulate_steps / answer tokens of the batch`, so that the schedule's mean over
    micro-batches is the batch's answer-token mean, as a single-process evaluation computes.
    `count_tokens(labels)` gives the batch's counted tokens (the RM overrides the labels).
    """

    first_stage_keys = ("input_ids", "attention_mask")

    def __init__(self, accumulate_steps, dataset_world_size=1):
        if accumulate_steps < 1:
            raise ValueError(f"accumulate_steps must be >= 1, got {accumulate_steps}")
        self.accumulate_steps = accumulate_steps
        self.dataset_world_size = dataset_world_size

    def first_stage(self, batch):
        mask = batch["attention_mask"]
        return batch["input_ids"], mask.astype("bool"), position_ids_from_mask(mask)

    def last_stage(self, batch):
        return batch["labels"]

    pad_values = {"attention_mask": 0, "labels": -100}
    """Right-padding of each key (others: 0, never read: the attention mask is 0 there)."""

    def right_pad(self, batch, width):
        """`batch` with every `[N, T]` tensor right-padded to `[N, width]`."""
        out = {}
        for key, value in batch.items():
            if isinstance(value, paddle.Tensor) and value.ndim == 2 and value.shape[1] < width:
                fill = paddle.full([value.shape[0], width - value.shape[1]], self.pad_values.get(key, 0), dtype=value.dtype)
                value = paddle.concat([value, fill], axis=1)
            out[key] = value
        return out

    @staticmethod
    def count_tokens(labels):
        return float((labels[:, 1:] >= 0).astype("float32").sum())

    def __call__(self, inputs):
        if isinstance(inputs, dict):
            return self.evaluation_batches(inputs)
        if len(inputs) != self.accumulate_steps:
            raise ValueError(f"expected {self.accumulate_steps} micro-batches, got {len(inputs)}")
        width = max(int(b["input_ids"].shape[1]) for b in inputs)
        inputs = [self.right_pad(b, width) for b in inputs]
        firsts = [self.first_stage(b) for b in inputs]
        return [tuple(list(column) for column in zip(*firsts)), [self.training_labels(b) for b in inputs]]

    def training_labels(self, batch):
        """The last stage's labels of a training micro-batch; `[labels, weight]` when the batch
        carries its optimiser step's token count (`ppo.common.step_tokens`): the weight makes
        the schedule's mean over micro-batches, averaged over data ranks, the token mean of the
        whole step, as the plain SFT loss computes it."""
        scale = step_token_scale(batch, self.accumulate_steps, self.dataset_world_size)
        if scale is None:
            return self.last_stage(batch)
        labels = self.last_stage(batch)
        return [labels, paddle.full([int(labels.shape[0]), 1], scale, dtype="float32")]

    def evaluation_batches(self, batch):
        rows = int(batch["input_ids"].shape[0])
        groups = [list(range(rows))[g :: self.accumulate_steps] for g in range(self.accumulate_steps)]
        total = max(self.count_tokens(batch["labels"]), 1.0)
        firsts, lasts = [], []
        for group in groups:
            weight = self.accumulate_steps / total
            if not group:  # fewer rows than micro-batches: a stand-in row that counts nothing
                group, weight = [0], 0.0
            part = {k: _rows(v, group) for k, v in batch.items() if isinstance(v, paddle.Tensor)}
            firsts.append(self.first_stage(part))
            lasts.append([self.last_stage(part), paddle.full([len(group), 1], weight, dtype="float32")])  # a list: fleet detaches its items
        return [tuple(list(column) for column in zip(*firsts)), lasts]


def wrapped_pipeline(trainer):
    """The `Trainer`'s pipeline model wrapped in fleet's `PipelineParallel` (for `eval_batch`);
    wraps it first when training has not (an evaluation before or without training)."""
    if trainer.model_wrapped is trainer.model:
        from paddle.distributed import fleet

        trainer.model_wrapped = fleet.distributed_model(trainer.model)
    return trainer.model_wrapped


def merged_tensor_parallel_state(pipe, state):
    """This stage's state dict (plain keys) with tensor-parallel slices merged over the
    model-parallel group (all its ranks call it), by the plain class's own tensor-parallel
    mappings (`ppo.strategy.tensor.reshard`); unchanged without tensor parallelism."""
    from ..tensor.reshard import merge, tensor_parallel_kinds
    from ...common.parallel_groups import model_parallel_group

    group = model_parallel_group()
    if group is None or group.nranks <= 1:
        return state
    kinds = tensor_parallel_kinds(plain_class(pipe.config), pipe.config, list(state), degree=group.nranks)
    merged = {}
    for name, value in state.items():
        if kinds[name] == "replicated":
            merged[name] = value
            continue
        shards = []
        dist.all_gather(shards, value.contiguous(), group=group)
        merged[name] = merge(shards, kinds[name], name)
    return merged


def all_stage_states(model, merge_tensor_parallel=True):
    """The whole model's state dict (plain-model keys, tensor-parallel slices merged) on every
    rank of the pipeline group: each stage broadcasts its tensors to the group, after their
    names, shapes and dtypes. All ranks of the pipeline and model-parallel groups must call it;
    without pipeline parallelism, this rank's (merged) state dict. `merge_tensor_parallel`
    False: every stage's slices of this rank's tensor-parallel rank, not merged."""
    from ...models.loading import unwrap_parallel

    pipe = unwrap_parallel(model)
    own = dict(pipe.state_dict())
    if merge_tensor_parallel:
        own = merged_tensor_parallel_state(pipe, own)
    group = pipeline_group()
    if group is None:
        return own
    metas = []
    dist.all_gather_object(metas, [(k, list(v.shape), str(v.dtype).split(".")[-1]) for k, v in own.items()], group=group)
    merged = {}
    for stage, meta in enumerate(metas):
        src = group.ranks[stage]
        for name, shape, dtype in meta:
            if dist.get_rank() == src:
                dist.broadcast(own[name].contiguous(), src=src, group=group)
                merged[name] = own[name]
            else:
                buf = paddle.empty(shape, dtype=dtype)
                dist.broadcast(buf, src=src, group=group)
                merged[name] = buf
    return merged


def save_pipeline_merged(model, path):
    """Write the pipeline model as one plain checkpoint in `path`: `model_state.pdparams`
    with the plain model's keys and `config.json` naming the plain class (the pipe's
    `merged_class_name` attribute, else the plain causal LM of its model type), so
    `from_pretrained` of that class loads it on one process. Every rank of the pipeline and
    model-parallel groups must call it; the first writes."""
    from ...models.loading import unwrap_parallel

    from paddle.distributed import fleet

    pipe = unwrap_parallel(model)
    state = all_stage_states(model)
    group = pipeline_group()
    hcg = fleet.get_hybrid_communicate_group() if group is not None else None
    copies = (hcg.get_data_parallel_rank(), hcg.get_sharding_parallel_rank(), hcg.get_model_parallel_rank()) if hcg else (0, 0, 0)
    if hcg is not None and (dist.get_rank() != group.ranks[0] or any(copies)):
        return  # not the first stage, or another data-parallel / sharding / tensor-parallel rank of it
    plain_class_name = getattr(pipe, "merged_class_name", None) or pipe_classes(pipe.config)[1]
    os.makedirs(path, exist_ok=True)
    paddle.save(state, os.path.join(path, "model_state.pdparams"))
    config = copy.deepcopy(pipe.config)
    config.architectures = [plain_class_name]
    config.tensor_parallel_degree, config.tensor_parallel_rank = 1, 0  # the slices are merged
    config.save_pretrained(path)
    logger.info(f"pipeline stages merged into {path} ({len(state)} tensors, {plain_class_name})")


def log_pipeline_settings(training_args):
    """Log once at start what a `pipeline_parallel_degree > 1` run of the `Trainer` entry points
    does not use (`logprob_chunk_size`). Its refusals are checked with the other arguments
    (`ppo.common.validation.pipeline_problems`)."""
    degree = training_args.pipeline_parallel_degree
    if getattr(training_args, "logprob_chunk_size", 0):
        logger.warning(
            f"logprob_chunk_size={training_args.logprob_chunk_size} is not used with pipeline_parallel_degree {degree}: "
            "the last stage's LM head computes full [micro-batch, seq, vocab] logits for the loss"
        )