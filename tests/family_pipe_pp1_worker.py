"""Worker for tests/test_family_pipes.py: one process, fleet at pp_degree=1.

`python tests/family_pipe_pp1_worker.py DIR CASE...` runs each CASE (`qwen3`, `qwen3:untied`,
`ernie45`, `ernie45:untied`, `qwen3:score`, `qwen3:recompute`: full recompute on; the MoE
archs, e.g. `mixtral`, `qwen3_moe:score`: refused, `qwen3_moe:score_no_router_loss`) in turn: it builds the tiny model of the family in
DIR/CASE (tied as the factory builds it; `untied`: the head a scaled copy of the embedding,
``[H, V]``), loads it as the plain causal LM (or score model) and as our pipeline class
(`ppo.strategy.pipeline.family_pipes`, or the score-model pipe built on it), and prints
`RESULT CASE {json}`: the pipe class, max |output difference| on a padded batch, max |grad
difference| over the parameters (same count and shapes asserted; a tied weight is one parameter
in both) and the pipe's state-dict keys against the plain model's; or `FAILED CASE error`.
Runs in its own process because `fleet.init` is process-global."""
import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

if not hasattr(dist.ParallelEnv(), "_device_id"):  # CPU: PipelineLayer reads the device id
    dist.ParallelEnv._device_id = 0


def build(path, arch, untied):
    from ppo.tiny.factory import build_tiny

    build_tiny(path, seed=5, hidden_size=64, num_layers=2, num_heads=16 if arch.startswith("ernie") else 4,
               intermediate_size=128, arch=arch)
    if untied:
        config_file, weights_file = os.path.join(path, "config.json"), os.path.join(path, "model_state.pdparams")
        config, weights = json.load(open(config_file)), paddle.load(weights_file)
        rows = next(v for k, v in weights.items() if k.endswith("embed_tokens.weight")).numpy()
        weights["lm_head.weight"] = paddle.to_tensor(np.ascontiguousarray(rows.T) * 1.5)
        config["tie_word_embeddings"] = False
        json.dump(config, open(config_file, "w"), indent=2)
        paddle.save(weights, weights_file)


def batch():
    rng = np.random.RandomState(0)
    ids = paddle.to_tensor(rng.randint(4, 100, (2, 12)))
    mask = np.ones((2, 12), "int64")
    mask[1, 9:] = 0
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return ids, paddle.to_tensor(mask), paddle.to_tensor(positions)


def outputs(plain, pipe, score):
    """Both models' outputs on `batch()` in training mode, and a weighted sum of them backward
    (plus the router losses of a mixture of experts: the plain model's `moe_aux_loss`, the
    pipe's from its router sums); `(plain output, pipe output, their router losses)`."""
    from ppo.strategy.pipeline.family_moe_pipe import router_losses_from_sums

    ids, mask, positions = batch()
    weights = paddle.to_tensor(np.random.RandomState(1).randn(2, 12, 1).astype("float32"))
    plain.train(), pipe.train()
    if score:
        a = plain(ids, attention_mask=mask, position_ids=positions).scores
    else:
        a = plain(input_ids=ids, attention_mask=mask, position_ids=positions, return_dict=True).logits
    b = pipe((ids, mask.astype("bool"), positions))
    aux = [getattr(plain, "moe_aux_loss", None), None]
    if isinstance(b, tuple):
        b, sums = b
        aux[1] = router_losses_from_sums(sums.sum(axis=0), pipe.config)[0]
    for out, extra in zip((a, b), aux):
        loss = (out * (weights if out.ndim == 3 else weights[..., 0])).sum()
        (loss if extra is None else loss + extra * 100).backward()  # x100: the router's gradient counts
    return a, b, [None if x is None else float(x) for x in aux]


def count_recompute(pipe):
    """Full recompute on `pipe`'s layers (as the Trainer's ``recompute`` sets it); the list that
    records each recomputed layer call."""
    from ppo.strategy.pipeline import family_pipes

    calls, original = [], family_pipes.recompute

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    family_pipes.recompute = counted
    pipe.config.recompute_granularity = "full"
    for layer in pipe.sublayers():
        if hasattr(layer, "enable_recompute"):
            layer.enable_recompute = True
    return calls


def run_case(case, path):
    from ppo.models.families import causal_lm_from_pretrained
    from ppo.models.score_model import AutoModelForScore
    from ppo.strategy.pipeline.pipe import load_pipe
    from ppo.strategy.pipeline.score_pipe import load_plain_score_pipe

    arch, _, variant = case.partition(":")
    build(path, arch, untied=variant == "untied")
    if variant == "score_no_router_loss":  # an MoE score pipe without router sums (output_router_logits false)
        config = json.load(open(os.path.join(path, "config.json")))
        json.dump({**config, "output_router_logits": False}, open(os.path.join(path, "config.json"), "w"))
        variant = "score"
    if variant == "score":
        paddle.seed(5)
        path_rm = path + "_rm"
        AutoModelForScore.from_pretrained(path).save_pretrained(path_rm)  # a saved head: both load it
        plain, pipe = AutoModelForScore.from_pretrained(path_rm), load_plain_score_pipe(path_rm)
    else:
        plain, pipe = causal_lm_from_pretrained(path), load_pipe(path, None, None)
    calls = count_recompute(pipe) if variant == "recompute" else []
    a, b, aux = outputs(plain, pipe, variant == "score")
    pa = [p for p in plain.parameters() if p.grad is not None]
    pb = [p for p in pipe.parameters() if p.grad is not None]
    assert len(pa) == len(pb), (len(pa), len(pb))
    assert [p.shape for p in pa] == [p.shape for p in pb]
    return {"pipe_class": type(pipe).__name__, "shape": list(b.shape), "out_diff": float((a - b).abs().max()),
            "n_grads": len(pa), "grad_diff": max(float((x.grad - y.grad).abs().max()) for x, y in zip(pa, pb)),
            "grad_max": max(float(x.grad.abs().max()) for x in pa),
            "router_losses": aux, "recomputed_layers": len(calls), "missing_keys": sorted(set(plain.state_dict()) - set(pipe.state_dict())),
            "extra_keys": sorted(set(pipe.state_dict()) - set(plain.state_dict()))}


def main(out_dir, cases):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    for case in cases:
        try:
            out = run_case(case, os.path.join(out_dir, case.replace(":", "_")))
        except Exception as e:  # noqa: BLE001 - reported per case; the test asserts
            print(f"FAILED {case} {type(e).__name__}: {e}".replace("\n", " "), flush=True)
            continue
        print(f"RESULT {case} " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
