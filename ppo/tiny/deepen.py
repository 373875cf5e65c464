"""A deeper copy of a tiny Llama that computes the same function: the judge demo's way to give a
policy room for one more step of reasoning without losing what it learnt.

A verdict on a reversal needs, at the verdict token, "some answer character differs from the
question character it mirrors"; the 2-layer tiny policy spends both layers finding and fetching
the mirrored character, so nothing is left to compare and gather (docs/distillation.md). `deepen`
appends `extra_layers` decoder layers after the policy's own, each with its attention output
projection (`o_proj`) and its MLP down projection (`down_proj`) at zero: a new layer then adds
nothing to the residual stream, so the deeper model's logits equal the policy's until training
moves them (the identity initialisation of progressive stacking, e.g. LLaMA Pro, Wu et al. 2024).

    python -m ppo.tiny.deepen --model outputs/tiny/grpo/policy --output_dir outputs/tiny/judge/deep --extra_layers 2
"""
import argparse
import json
import os
import shutil

import numpy as np

LAYER = "llama.layers.{}."
ZERO_INIT = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def deepened_state(state, num_layers, extra_layers, std=0.02, seed=0):
    """`state` (name -> numpy array) of a `num_layers`-layer Llama with `extra_layers` more layers
    appended: each a copy of the last layer's shapes, norms at 1, `ZERO_INIT` at 0, the other
    matrices drawn from N(0, std^2) with `seed`. The input is not written into."""
    rng = np.random.RandomState(seed)
    last = LAYER.format(num_layers - 1)
    template = {k[len(last):]: v for k, v in state.items() if k.startswith(last)}
    if not template:
        raise ValueError(f"no parameters named {last}* in the state: not a {num_layers}-layer Llama")
    out = dict(state)
    for layer in range(num_layers, num_layers + extra_layers):
        for name, value in template.items():
            if name.endswith("layernorm.weight"):
                new = np.ones_like(value)
            elif name in ZERO_INIT:
                new = np.zeros_like(value)
            else:
                new = (rng.randn(*value.shape) * std).astype(value.dtype)
            out[LAYER.format(layer) + name] = new
    return out


def deepen(model_dir, output_dir, extra_layers=2, seed=0):
    """Write the deepened copy of the model in `model_dir` (config, weights, tokenizer files) to
    `output_dir`; returns its number of layers."""
    import paddle

    config = json.load(open(os.path.join(model_dir, "config.json")))
    if config.get("model_type") != "llama":
        raise ValueError(f"deepen supports the tiny Llama models, got model_type {config.get('model_type')!r}")
    num_layers = int(config["num_hidden_layers"])
    state = {k: v.numpy() for k, v in paddle.load(os.path.join(model_dir, "model_state.pdparams")).items()}
    deeper = deepened_state(state, num_layers, extra_layers, float(config.get("initializer_range", 0.02)), seed)
    os.makedirs(output_dir, exist_ok=True)
    for name in os.listdir(model_dir):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path) and (name.endswith((".json", ".model", ".txt")) and "state" not in name):
            shutil.copy(path, os.path.join(output_dir, name))
    config["num_hidden_layers"] = num_layers + extra_layers
    json.dump(config, open(os.path.join(output_dir, "config.json"), "w"), indent=2)
    paddle.save({k: paddle.to_tensor(v) for k, v in deeper.items()}, os.path.join(output_dir, "model_state.pdparams"))
    return num_layers + extra_layers


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the tiny Llama to deepen (a model directory)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--extra_layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps({"num_hidden_layers": deepen(args.model, args.output_dir, args.extra_layers, args.seed)}))


if __name__ == "__main__":
    main()
