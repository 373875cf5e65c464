"""Rotary-embedding and attention-window fields of a Hugging Face `config.json`, in either layout
(pure Python, no I/O).

transformers 4 writes a top-level `rope_theta` and `rope_scaling` (`{"rope_type" | "type": ...,
"factor": ...}` or null); transformers 5 writes `rope_parameters` (`{"rope_theta": ...,
"rope_type": ..., <scaling fields>}`; per layer type, `{"full_attention": {...}, ...}`, in
families with sliding layers). `read_rope` reads both into one `Rope`; `paddle_fields` turns it
into the PaddleNLP config fields of a family (`PADDLE_ROPE` says which rope types each family's
PaddleNLP model computes) and names every field it cannot honour; `normalise` does both plus the
attention-window check, and is what an importer calls. `hf_fields` writes a PaddleNLP config's
rotary fields back in the layout asked for. Nothing falls back silently: a config without any
theta gets transformers' own default (10,000, as `LlamaConfig` / `Qwen2Config` declare it);
everything else that changes the numbers is either honoured or named in a refusal.
"""
from dataclasses import dataclass, field

DEFAULT_THETA = 10000.0
"""transformers' `rope_theta` when a Llama / Qwen2 config names none (its `LlamaConfig` default)."""
LAYOUTS = ("both", "transformers4", "transformers5")
"""`both`: top-level `rope_theta` / `rope_scaling` and `rope_parameters` (transformers 4 reads the
first, 5 either); `transformers4`: the first only; `transformers5`: `rope_parameters` only."""
SCALING_KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
"""The fields transformers reads for each rope type it shares with PaddleNLP."""
PADDLE_ROPE = {"llama": ("default", "linear", "llama3"), "qwen2": ("default",)}
"""Rope types PaddleNLP 3.0.0b4's models compute: `LlamaAttention._init_rope` (plain,
`LlamaLinearScalingRotaryEmbedding`, `Llama3RotaryEmbedding`); `Qwen2Attention` plain only (it
reads no scaling field). PaddleNLP's `ntk` / `dynamic_ntk` have no transformers twin that computes
the same numbers (transformers' `dynamic` recomputes its frequencies as generation grows)."""
ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")
"""Rope types whose `original_max_position_embeddings` transformers 5 fills in when absent."""
LAYER_KEYS = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")


@dataclass(frozen=True)
class Rope:
    """Rotary settings of a config, whichever layout it was written in."""

    theta: float = DEFAULT_THETA
    rope_type: str = "default"
    scaling: dict = field(default_factory=dict)  # every other field of the rope dict (factor, ...)
    partial_rotary_factor: float = 1.0


def _rope_dicts(hf):
    """`(legacy rope_scaling dict or {}, rope_parameters dict or {}, problems)`; a per-layer-type
    `rope_parameters` is accepted when every layer type has the same settings."""
    problems = []
    legacy = hf.get("rope_scaling") or {}
    params = hf.get("rope_parameters") or {}
    if not isinstance(legacy, dict):
        problems.append(f"rope_scaling {legacy!r}: expected an object or null")
        legacy = {}
    if not isinstance(params, dict):
        problems.append(f"rope_parameters {params!r}: expected an object or null")
        params = {}
    nested = [v for k, v in params.items() if k in LAYER_KEYS]
    if nested:
        if any(v != nested[0] for v in nested) or len(nested) != len(params):
            problems.append(f"rope_parameters per layer type differ ({sorted(params)}): one rotary table per model here")
        params = dict(nested[0]) if isinstance(nested[0], dict) else {}
    return legacy, params, problems


def _one_value(name, sources, default):
    """The value of `name` that every source naming it agrees on (`default` when none does);
    problems name the disagreeing fields."""
    found = [(where, value) for where, value in sources if value is not None]
    if not found:
        return default, []
    if any(value != found[0][1] for _, value in found):
        return found[0][1], [f"{name} given differently in {', '.join(f'{w}={v!r}' for w, v in found)}"]
    return found[0][1], []


def _number(name, value, problems):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(f"{name} {value!r}: expected a number")
        return None
    return float(value)


def _original_length(hf, scaling):
    """`(original_max_position_embeddings, problems)` as transformers 5 reads it for a scaled rope:
    the top-level field first, then the rope dict's, then `max_position_embeddings`; problems when
    the top-level and rope-dict values differ (transformers 4 reads the second)."""
    top, inner = hf.get("original_max_position_embeddings"), scaling.get("original_max_position_embeddings")
    if top is not None and inner is not None and top != inner:
        return top, [f"original_max_position_embeddings {top} but the rope dict's {inner}"]
    return next((v for v in (top, inner, hf.get("max_position_embeddings")) if v is not None), None), []


def read_rope(hf):
    """`(Rope, problems)` of a Hugging Face config dict in the transformers 4 or 5 layout (or both,
    when they agree). Problems name fields that contradict each other or are not numbers."""
    legacy, params, problems = _rope_dicts(hf)
    theta, bad = _one_value("rope_theta", [("rope_theta", hf.get("rope_theta")),
                                           ("rope_parameters.rope_theta", params.get("rope_theta"))], DEFAULT_THETA)
    problems += bad
    kind, bad = _one_value("rope_type", [("rope_scaling.rope_type", legacy.get("rope_type")),
                                         ("rope_scaling.type", legacy.get("type")),
                                         ("rope_parameters.rope_type", params.get("rope_type"))], "default")
    problems += bad
    partial, bad = _one_value("partial_rotary_factor", [
        ("partial_rotary_factor", hf.get("partial_rotary_factor")),
        ("rope_parameters.partial_rotary_factor", params.get("partial_rotary_factor"))], 1.0)
    problems += bad
    skip = {"rope_theta", "rope_type", "type", "partial_rotary_factor"}
    legacy_scaling = {k: v for k, v in legacy.items() if k not in skip}
    new_scaling = {k: v for k, v in params.items() if k not in skip}
    for key in sorted(set(legacy_scaling) & set(new_scaling)):
        if legacy_scaling[key] != new_scaling[key]:
            problems.append(f"rope_scaling.{key}={legacy_scaling[key]!r} but rope_parameters.{key}={new_scaling[key]!r}")
    scaling = {**legacy_scaling, **new_scaling}
    if str(kind) in ORIGINAL_LENGTH_TYPES:
        scaling["original_max_position_embeddings"], bad = _original_length(hf, scaling)
        problems += bad
    theta = _number("rope_theta", theta, problems)
    partial = _number("partial_rotary_factor", partial, problems)
    rope = Rope(theta if theta is not None else DEFAULT_THETA, str(kind), scaling,
                partial if partial is not None else 1.0)
    return rope, problems


def paddle_fields(rope, model_type, honoured=None):
    """`(PaddleNLP config fields, problems)` of `rope` for PaddleNLP's `model_type` model:
    `rope_theta` always; `rope_scaling_type` / `rope_scaling_factor` for linear; `rope_scaling`
    (transformers' llama3 dict) for llama3. Problems name what that model would not compute.
    `honoured`: the rope types the model computes (default: `PADDLE_ROPE`, else plain only)."""
    honoured = honoured or PADDLE_ROPE.get(model_type, ("default",))
    problems = []
    if rope.partial_rotary_factor != 1.0:
        problems.append(f"partial_rotary_factor {rope.partial_rotary_factor} (PaddleNLP rotates every head dimension)")
    if rope.rope_type not in honoured:
        problems.append(f"rope_type {rope.rope_type!r} (PaddleNLP's {model_type} computes {', '.join(honoured)})")
        return {"rope_theta": rope.theta}, problems
    keys = SCALING_KEYS[rope.rope_type]
    missing = [k for k in keys if rope.scaling.get(k) is None]
    if missing:
        problems.append(f"rope_type {rope.rope_type!r} without {', '.join(missing)}")
        return {"rope_theta": rope.theta}, problems
    values = {k: _number(f"rope {k}", rope.scaling[k], problems) for k in keys}
    if problems:
        return {"rope_theta": rope.theta}, problems
    fields = {"rope_theta": rope.theta}
    if rope.rope_type == "linear":
        fields.update(rope_scaling_type="linear", rope_scaling_factor=values["factor"])
    elif rope.rope_type == "llama3":
        values["original_max_position_embeddings"] = int(values["original_max_position_embeddings"])
        fields["rope_scaling"] = {"rope_type": "llama3", **values}
    return fields, problems


def window_problems(hf, model_type):
    """Attention windows a config puts in use (PaddleNLP's Llama and Qwen2 attend to the whole
    sequence). transformers' Llama has no window; its Qwen2 (and Qwen3) keeps `sliding_window` only
    with `use_sliding_window`, and windows the layers `layer_types` marks `sliding_attention`
    (when absent: those from `max_window_layers` on). A window spanning `max_position_embeddings`
    masks nothing and is accepted."""
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    if model_type == "llama" or window is None or window >= hf.get("max_position_embeddings", float("inf")):
        return []
    types = hf.get("layer_types")
    if types is None:
        start = hf.get("max_window_layers", 0)
        types = ["sliding_attention" if i >= start else "full_attention" for i in range(hf.get("num_hidden_layers", 0))]
    windowed = [i for i, kind in enumerate(types) if kind != "full_attention"]
    if not windowed:
        return []
    kinds = sorted({types[i] for i in windowed})
    return [f"use_sliding_window true with sliding_window {window} in layers {windowed[:8]} ({', '.join(kinds)}): "
            "PaddleNLP's attention is full in every layer"]


def normalise(hf, model_type, honoured=None):
    """`(PaddleNLP rotary config fields, problems)` of a Hugging Face config dict of either
    layout, for PaddleNLP's `model_type` model: see `read_rope`, `paddle_fields` (`honoured`),
    `window_problems`."""
    rope, problems = read_rope(hf)
    fields, more = paddle_fields(rope, model_type, honoured)
    return fields, problems + more + window_problems(hf, model_type)


def rope_of_paddle(cfg):
    """The `Rope` a PaddleNLP config dict computes (`rope_scaling` llama3, `rope_scaling_type`
    linear, or plain); raises on PaddleNLP's `ntk` / `dynamic_ntk`, which transformers does not compute."""
    theta = float(cfg.get("rope_theta", DEFAULT_THETA))
    llama3 = cfg.get("rope_scaling") or {}
    if llama3.get("rope_type") == "llama3":
        return Rope(theta, "llama3", {k: llama3[k] for k in SCALING_KEYS["llama3"]})
    kind = cfg.get("rope_scaling_type")
    if kind is None:
        return Rope(theta)
    if kind == "linear":
        return Rope(theta, "linear", {"factor": float(cfg.get("rope_scaling_factor", 1.0))})
    raise ValueError(f"rope_scaling_type {kind!r}: no Hugging Face rope type computes it; supported: none, linear, llama3")


def hf_fields(rope, layout="both"):
    """The `config.json` fields of `rope` in `layout` (`LAYOUTS`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {LAYOUTS}")
    out = {}
    if layout in ("both", "transformers4"):
        scaling = None if rope.rope_type == "default" else {"rope_type": rope.rope_type, **rope.scaling}
        out.update(rope_theta=rope.theta, rope_scaling=scaling)
    if layout in ("both", "transformers5"):
        out["rope_parameters"] = {"rope_theta": rope.theta, "rope_type": rope.rope_type, **rope.scaling}
    if rope.partial_rotary_factor != 1.0:
        if "rope_parameters" in out:
            out["rope_parameters"]["partial_rotary_factor"] = rope.partial_rotary_factor
        if layout != "transformers5":
            out["partial_rotary_factor"] = rope.partial_rotary_factor
    return out


def with_layout(hf, layout):
    """A copy of the Hugging Face config dict `hf` with its rotary fields rewritten in `layout`
    (raises naming the fields when they contradict each other)."""
    rope, problems = read_rope(hf)
    if problems:
        raise ValueError("; ".join(problems))
    rotary = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor")
    out = {k: v for k, v in hf.items() if k not in rotary}
    return {**out, **hf_fields(rope, layout)}
