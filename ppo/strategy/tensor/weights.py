"""The tensor layout's checkpoints: a model split over the model-parallel group is saved as one
merged checkpoint (PaddleNLP's `merge_tensor_parallel`) that a single-rank run loads, and a
merged state dict is cut back to this rank's slices with the model's own tensor-parallel
mappings (`from_pretrained` does the same at load time)."""
from ...common.parallel_groups import model_parallel_group
from ...models.basics import unwrap_model


def is_split(model):
    """Whether `model` (any wrappers) holds tensor-parallel slices."""
    return model_parallel_group() is not None and getattr(unwrap_model(model).config, "tensor_parallel_degree", 1) > 1


def save_pretrained_merged(model, path, **kwargs):
    """`save_pretrained` that merges tensor-parallel slices into one checkpoint (PaddleNLP's
    `merge_tensor_parallel`); every rank of the model-parallel group must call it, rank 0 of
    the group writes. Without tensor parallelism, a plain `save_pretrained`."""
    if is_split(model):
        model.save_pretrained(path, merge_tensor_parallel=True, **kwargs)
    else:
        model.save_pretrained(path, **kwargs)


def split_for_this_rank(model, state_dict):
    """A merged (single-rank) state dict cut to this rank's slices with the model's own
    tensor-parallel mappings (what `from_pretrained` does at load time); unchanged when
    `model` is not split. A LoRA adapter's state is split by its `LoRAModel` mappings."""
    if not is_split(model):
        return state_dict
    if type(model).__name__ == "LoRAModel":
        return model._convert_tensor_parallel(lora_state_dict=dict(state_dict))
    base = unwrap_model(model)
    return type(base).convert_tensor_parallel(None, base.config, state_dict=dict(state_dict))

