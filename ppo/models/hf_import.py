"""Build our models from Hugging Face safetensors directories (Llama, Qwen2, Qwen3), no torch needed.

`load_hf_model(path, dtype)` builds a PaddleNLP `LlamaForCausalLM` / `Qwen2ForCausalLM`, our
`Qwen3ForCausalLM` (`ppo.models.families`), or our
`<Arch>ModelForScore` for a one-label `*ForSequenceClassification` directory, and fills it with
the directory's tensors renamed and transposed (`ppo.models.hf_format`). Every tensor of the
model must come from the file and every tensor of the file must find a home; anything else is an
error naming the tensors. `import_dir` saves the result in PaddleNLP's layout with
`save_pretrained`, with the tokenizer files copied.
"""
import os

from . import hf_files, hf_format
from .hf_files import copy_tokenizer, read_json

MODEL_ONLY_KEYS = ("rotary_emb.inv_freq",)
"""Model tensors never stored in a checkpoint (recomputed at construction)."""


def model_class(model_type, score):
    """`(config class, model class)` of `model_type`: a family's own classes
    (`ppo.models.families`) or PaddleNLP's."""
    from .families import family_module
    from .score_model import score_model_class

    module = family_module(model_type)
    if module is not None:
        config_cls, causal_cls = module.CONFIG_CLASS, module.CAUSAL_LM_CLASS
    else:
        from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

        config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[model_type]
        causal_cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}[model_type]
    return config_cls, score_model_class(model_type) if score else causal_cls


def build_config(hf_config, dtype=None, score=None, **config_overrides):
    """`(model class, PaddleNLP config, score settings read from the file or None)` of a Hugging
    Face config dict. `dtype` None keeps the checkpoint's. `score` None builds the directory's
    kind, True a score model (from a causal-LM directory: its backbone, a new head), False a causal
    LM (a score directory is refused). Score settings and `config_overrides` become config fields."""
    from .score_model import SCORE_CONFIG_DEFAULTS

    model_type, kwargs, file_score = hf_format.paddle_config(hf_config)
    if score is False and file_score is not None:
        raise ValueError(f"{hf_config['architectures']}: a score model, not a causal LM")
    want_score = file_score is not None if score is None else score
    kwargs["dtype"] = dtype or kwargs["dtype"]
    config_cls, cls = model_class(model_type, want_score)
    rope_scaling = kwargs.pop("rope_scaling", None)
    config = config_cls(**kwargs)
    if rope_scaling is not None:
        config.rope_scaling = rope_scaling
    config.architectures = [cls.__name__]
    if want_score:
        for key in hf_format.SCORE_FIELDS:
            setattr(config, key, (file_score or {}).get(key, SCORE_CONFIG_DEFAULTS[key]))
    for key, value in config_overrides.items():
        setattr(config, key, value)
    return cls, config, file_score


def to_paddle(value, dtype):
    """A paddle tensor of numpy `value` (`uint16` = bfloat16 bits) cast to `dtype`."""
    import paddle

    tensor = paddle.to_tensor(value, dtype="bfloat16") if value.dtype.name == "uint16" else paddle.to_tensor(value)
    return tensor if str(tensor.dtype).replace("paddle.", "") == dtype else tensor.astype(dtype)


def fill_model(model, tensors, new_head=False):
    """Set `model`'s parameters from PaddleNLP-named numpy `tensors`; raises naming any tensor
    that is missing, unused or of another shape. `new_head`: the score head keeps its
    initialisation (a score model built on a causal LM)."""
    state = model.state_dict()
    skip = [n for n in state if any(k in n for k in MODEL_ONLY_KEYS) or n in hf_format.NORMALIZER_STATS
            or (new_head and n.startswith("score_head."))]
    tied = getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" in state
    wanted = set(state) - set(skip) - ({"lm_head.weight"} if tied else set())
    missing, extra = sorted(wanted - set(tensors)), sorted(set(tensors) - wanted)
    wrong = sorted(f"{n}: {tuple(tensors[n].shape)} != {tuple(state[n].shape)}"
                   for n in wanted & set(tensors) if tuple(tensors[n].shape) != tuple(state[n].shape))
    if missing or extra or wrong:
        raise ValueError(f"Hugging Face checkpoint does not fit {type(model).__name__}: missing {missing[:5]}, "
                         f"unused {extra[:5]}, wrong shapes {wrong[:5]}")
    for name in sorted(wanted):
        state[name].set_value(to_paddle(tensors[name], str(state[name].dtype).replace("paddle.", "")))
    if tied and model.lm_head.weight is not model.get_input_embeddings().weight:
        raise ValueError("tie_word_embeddings: the LM head does not share the embedding weight")


def set_normalizer(model, score):
    import paddle

    for key in hf_format.NORMALIZER_STATS:
        if key in score:
            getattr(model, key).set_value(paddle.to_tensor([float(score[key])], dtype="float32"))


def load_hf_model(path, dtype=None, score=None, **config_overrides):
    """Our causal LM or score model of the Hugging Face directory `path` in `dtype` (None: the
    checkpoint's). `score`: see `build_config`; a score model built on a causal-LM directory gets
    a new head initialised as PaddleNLP initialises one. `config_overrides` are set on the
    PaddleNLP config (score settings, flash attention, recompute, ...); tensor parallelism is
    refused (convert with scripts/import_hf.py first, then PaddleNLP's loader splits the weights)."""
    from paddlenlp.transformers.model_utils import dtype_guard, no_init_weights

    if int(config_overrides.get("tensor_parallel_degree", 1) or 1) > 1:
        raise ValueError(f"{path}: a Hugging Face directory loads whole; for tensor_parallel_degree > 1 convert it "
                         "first: python scripts/import_hf.py --hf_path DIR --output_dir OUT")
    hf_config = read_json(os.path.join(path, "config.json"))
    cls, config, file_score = build_config(hf_config, dtype, score, **config_overrides)  # refuses before the weights
    tensors = hf_files.read_safetensors(path)
    new_head = hasattr(cls, "init_score_head") and file_score is None
    if file_score is not None:
        config.score_bias = "score.bias" in tensors
    if new_head:
        tensors.pop("lm_head.weight", None)
    with no_init_weights(_enable=not new_head), dtype_guard(config.dtype):
        model = cls(config)
    named = hf_format.paddle_tensors(tensors, config.to_dict(), score=file_score is not None)
    fill_model(model, named, new_head=new_head)
    if file_score is not None:
        set_normalizer(model, file_score)
    return model


def config_problems(path):
    """The problems of the Hugging Face directory `path`'s `config.json` that `load_hf_model` would
    refuse (architecture, rotary settings, attention windows, ...), as one line naming the file; none: []."""
    file = os.path.join(path, "config.json")
    try:
        hf_format.paddle_config(read_json(file))
    except (ValueError, KeyError, TypeError, OSError) as err:
        detail = f"missing field {err}" if isinstance(err, KeyError) else str(err)
        return [f"{file}: {detail}"]
    return []


def hf_config_problems(model_dirs):
    """One problem per `(argument name, path)` of `model_dirs` that names a Hugging Face directory
    whose `config.json` the import refuses; the start-up checks call it before any model loads."""
    problems = []
    for name, path in model_dirs:
        try:
            hf = hf_files.is_hf_dir(path)
        except Exception:  # unreadable weights: the model-directory checks name the file
            hf = False
        problems += [f"{name}: {p}" for p in config_problems(path)] if hf else []
    return problems


def import_dir(path, output_dir, dtype=None, safe_serialization=False):
    """Save the Hugging Face directory `path` in PaddleNLP's layout (`save_pretrained`) with its
    tokenizer files. Returns `(model, tokenizer files written)`."""
    model = load_hf_model(path, dtype=dtype)
    model.save_pretrained(output_dir, safe_serialization=safe_serialization)
    return model, copy_tokenizer(path, output_dir, to_hf=False)
