"""The score model (`ppo.models.score_model`) as a pipeline-parallel model, for reward-model
training under `pipeline_parallel_degree > 1`.

PaddleNLP's `LlamaForCausalLMPipe` / `Qwen2ForCausalLMPipe` with the LM head replaced by
`ScoreHeadPipe` (the score head `[H] -> 1`, plus the score normaliser's buffers): the last
stage outputs per-token scores `[N, T]` and `PairwiseRewardCriterion` turns them into the
pairwise RM loss. Parameter names are the plain score model's (`llama.*` / `qwen2.*`,
`score_head.*`, `normalizer_*`), so a plain score checkpoint loads into the stages and
`ppo.strategy.pipeline.pipe.save_pipeline_merged` writes one that `AutoModelForScore` loads.

A micro-batch holds whole pairs: `PreferencePipelineInputs` stacks its `m` better rows over
its `m` worse rows (`[2m, T]`), as `rm.reward_trainer.score_pairs` does for a batch.
"""
import paddle
import paddle.nn as nn
import paddle.distributed as dist

from ...models.causal_lm import last_token_index
from .pipe import CausalLMPipelineInputs, install_last_stage_loss, pipe_classes, pipeline_group, refuse_hf_dir
from ...models.score_model import ScoreModelMixin, pair_scores_loss, score_config


class ScoreHeadPipe(ScoreModelMixin, nn.Layer):
    """Last pipeline layer: final hidden states `[N, T, H]` -> raw scores `[N, T]` float32 (the
    score model's `score_head`, and its normaliser buffers and methods, which
    `PairwiseRewardCriterion` applies where the plain model's forward does)."""

    def __init__(self, config):
        nn.Layer.__init__(self)
        self.config = config
        self.init_score_head(config)

    def forward(self, hidden_states):
        return self.score_head(hidden_states).squeeze(-1).astype("float32")


def end_scores_of(scores, attention_mask):
    """Each row's score at its last real token: `[N, T]`, `[N, T]` -> `[N]`."""
    index = last_token_index(attention_mask).unsqueeze(-1)
    return paddle.take_along_axis(scores, index, axis=-1).squeeze(-1)


class PairwiseRewardCriterion(nn.Layer):
    """RM loss on the last stage: `scores [2m, T]` (better rows first) and
    `labels = [input_ids [2m, T], attention_mask [2m, T]]` -> `pair_scores_loss`'s loss.

    The score normaliser acts as in the plain model's forward: in training mode with a
    `normalizer_type`, the end scores update the head's statistics, and with `do_normalize`
    the scores are normalised with them. `head` is the last stage's `ScoreHeadPipe` (None on
    the other stages, which never compute the loss)."""

    def __init__(self, loss_type, regularization, head):
        super().__init__()
        self.loss_type, self.regularization = loss_type, regularization
        self.head = [head]  # a list: not registered as a sublayer (its parameters belong to the pipe)

    def forward(self, scores, labels):
        input_ids, mask = labels
        m = input_ids.shape[0] // 2
        head = self.head[0]
        end_scores = end_scores_of(scores, mask)
        if head.training and head.config.normalizer_type:
            head.update_normalizer(end_scores)
        loss, _ = pair_scores_loss(
            head.normalize(scores), head.normalize(end_scores), input_ids[:m], input_ids[m:], mask[:m], mask[m:],
            self.loss_type, self.regularization,
        )
        return loss


def stack_pairs(batch, keys=("input_ids", "attention_mask"), prefix=""):
    """A preference batch's `{prefix}better_*`, `{prefix}worse_*` `[B, T]` as `[2B, T]` tensors
    under the plain `keys`, better rows first."""
    return {key: paddle.concat([batch[f"{prefix}better_{key}"], batch[f"{prefix}worse_{key}"]], axis=0) for key in keys}


class PreferencePipelineInputs(CausalLMPipelineInputs):
    """`CausalLMPipelineInputs` for preference batches: each micro-batch's pairs stacked
    (`stack_pairs`), right-padded alike; the last stage gets `[input_ids, attention_mask]`.
    Evaluation does not go through the `Trainer`'s loss (see `pipeline_end_scores`)."""

    pad_values = {"better_attention_mask": 0, "worse_attention_mask": 0, "better_labels": -100, "worse_labels": -100}
    stacked_keys = ("input_ids", "attention_mask")
    """The keys of each side that `evaluation_groups` stacks."""

    def __call__(self, inputs):
        if isinstance(inputs, dict):
            raise ValueError("preference batches are evaluated with pipeline_end_scores, not the Trainer's loss")
        width = max(int(b["better_input_ids"].shape[1]) for b in inputs)
        stacked = [stack_pairs(self.right_pad(b, width)) for b in inputs]
        firsts = [self.first_stage(b) for b in stacked]
        lasts = [[b["input_ids"], b["attention_mask"]] for b in stacked]
        return [tuple(list(column) for column in zip(*firsts)), lasts]

    def evaluation_groups(self, batch, prefix=""):
        """`(micro-batches, pair groups)`: the batch's pairs (`{prefix}better_*`,
        `{prefix}worse_*`) cut into `accumulate_steps` groups, each stacked (`[2k, T]`); a group
        without pairs repeats pair 0, dropped again by `ungroup`."""
        pairs = int(batch[f"{prefix}better_input_ids"].shape[0])
        groups = [list(range(pairs))[g :: self.accumulate_steps] for g in range(self.accumulate_steps)]
        micro = []
        for group in groups:
            index = paddle.to_tensor(group or [0], dtype="int64")
            names = [f"{prefix}{side}_{key}" for side in ("better", "worse") for key in self.stacked_keys]
            sides = {name: paddle.index_select(batch[name], index, axis=0) for name in names}
            micro.append(stack_pairs(sides, self.stacked_keys, prefix))
        return micro, groups

    @staticmethod
    def ungroup(groups, values):
        """Per-micro-batch values `[2k]` (better rows first) of `evaluation_groups` back in the
        batch's order: `[2B]`, the better rows of pairs 0..B-1, then their worse rows."""
        pairs = sum(len(g) for g in groups)
        better, worse = [None] * pairs, [None] * pairs
        for group, value in zip(groups, values):
            for j, pair in enumerate(group):
                better[pair], worse[pair] = value[j], value[len(group) + j]
        return paddle.stack(better + worse)


def load_score_pipe(path, loss_type, regularization, accumulate_steps, dtype="float32", **config_overrides):
    """This rank's stage of the score model in `path` (a saved score model: its score head and
    normaliser statistics are loaded) for pairwise RM training."""
    model = load_plain_score_pipe(path, dtype, **config_overrides)
    install_last_stage_loss(model, PairwiseRewardCriterion(loss_type, regularization, score_head_of(model)),
                            PreferencePipelineInputs(accumulate_steps))
    return model


def score_head_of(pipe):
    """The `ScoreHeadPipe` of this rank's stage of a score-model pipe (None but on the last)."""
    heads = [layer for layer in pipe.sublayers() if isinstance(layer, ScoreHeadPipe)]
    return heads[0] if heads else None


def load_plain_score_pipe(path, dtype="float32", **config_overrides):
    """This rank's stage of the score model saved in `path` (score head and normaliser
    statistics loaded), without a loss; `config_overrides` as `AutoModelForScore.from_pretrained`'s."""
    from ...models.loading import is_lora_dir

    if is_lora_dir(path):
        raise ValueError(f"pipeline_parallel_degree > 1 with a LoRA adapter ({path}): not implemented here")
    refuse_hf_dir(path)
    config = score_config(path, **config_overrides)
    return score_pipe_class(config).from_pretrained(path, config=config, dtype=dtype)


_SCORE_PIPES = {}


def score_pipe_class(config):
    """`<Arch>ModelForScorePipe`: the causal-LM pipe of `config.model_type` whose `lm_head`
    layer is a `ScoreHeadPipe` named like the plain score model's head."""
    from paddle.distributed.fleet.meta_parallel import LayerDesc

    pipe_cls, _ = pipe_classes(config)
    if pipe_cls not in _SCORE_PIPES:
        plain_name = pipe_cls.__name__.replace("ForCausalLMPipe", "ModelForScore")

        def add_sequential_layer(self, layer_desc, name_prefix=""):
            if name_prefix == "lm_head":
                layer_desc, name_prefix = LayerDesc(ScoreHeadPipe, config=self.config), ""
            pipe_cls.add_sequential_layer(self, layer_desc, name_prefix)

        _SCORE_PIPES[pipe_cls] = type(
            f"{plain_name}Pipe",
            (pipe_cls,),
            {
                "add_sequential_layer": add_sequential_layer,
                "merged_class_name": plain_name,
                "_keys_to_ignore_on_load_unexpected": [r"lm_head", r"rotary_emb.inv_freq"],
                "_keys_to_ignore_on_load_missing": [r"score_head", r"normalizer_"],
                "__doc__": f"{pipe_cls.__name__} with the score head as its last layer.",
            },
        )
    return _SCORE_PIPES[pipe_cls]


def pipeline_end_scores(model, inputs):
    """End scores `[2B]` (better rows first, as `rm.reward_trainer.score_pairs`) of a preference
    batch through the wrapped pipeline model (`fleet`'s `PipelineParallel.eval_batch`), on every
    rank of the pipeline group (broadcast from the last stage)."""
    prepare = model._layers._prepare_pipeline_inputs_func
    micro, groups = prepare.evaluation_groups(inputs)
    firsts = [prepare.first_stage(b) for b in micro]
    data = [tuple(list(column) for column in zip(*firsts)), [[b["input_ids"], b["attention_mask"]] for b in micro]]
    model._p2p_helper.clear_meta_cache()
    with paddle.no_grad():
        outputs = model.eval_batch(data, compute_loss=False)
    model._p2p_helper.clear_meta_cache()
    B = int(inputs["better_input_ids"].shape[0])
    ends = paddle.zeros([2 * B], dtype="float32")
    if model.is_pipeline_last_stage():
        ends = prepare.ungroup(groups, [end_scores_of(scores, b["attention_mask"]) for scores, b in zip(outputs, micro)])
    group = pipeline_group()
    dist.broadcast(ends, src=group.ranks[-1], group=group)
    return ends
