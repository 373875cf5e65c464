"""Worker for tests/test_pipeline_models.py: one process, fleet at pp_degree=1.

`python tests/pipeline_pp1_worker.py DIR CASE...` runs each CASE (`llama`, `qwen2`, `qwen2:tied`)
in turn: it builds a small real-shaped checkpoint of the model type (GQA) in DIR/CASE, loads it
as the plain causal LM and as PaddleNLP's `*ForCausalLMPipe`, and prints one line per case:
`RESULT CASE {json}` with max |logits difference| and max |grad difference| over the parameters
taken in order (same count and shapes asserted), or `FAILED CASE error text` when the case
raised. Runs in its own process because `fleet.init` is global (one init serves every case:
all are pp_degree=1); the cases share it so the test pays one process start-up, not three.

Qwen2 is tested untied unless the case is `qwen2:tied`: with tie_word_embeddings
paddlenlp 3.0.0b4's Qwen2ForCausalLMPipe adds its LM head as a SharedLayerDesc without a
forward_func, so PipelineLayer runs the shared *embedding* on the hidden states
("embedding input only support int32 and int64, but get float32")."""
import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

# CPU stand-in: PipelineLayer.__init__ reads dist.ParallelEnv().device_id, which paddle only
# sets for accelerator builds (AttributeError '_device_id' on CPU).
if not hasattr(dist.ParallelEnv(), "_device_id"):
    dist.ParallelEnv._device_id = 0


def run_case(model_type, out_dir, tied):
    from paddlenlp.transformers import (LlamaForCausalLM, LlamaForCausalLMPipe, Qwen2ForCausalLM,
                                        Qwen2ForCausalLMPipe)

    from ppo.tiny.factory import build_real_shape
    build_real_shape(out_dir, {"llama": "llama3", "qwen2": "qwen2.5-0.5b"}[model_type], num_layers=2, small=True)
    if model_type == "qwen2" and not tied:
        # Same small Qwen2 with an untied LM head (see the module docstring for why).
        from paddlenlp.transformers import Qwen2Config
        config = Qwen2Config.from_pretrained(out_dir)
        config.tie_word_embeddings = False
        paddle.seed(7)
        Qwen2ForCausalLM(config).save_pretrained(out_dir)
    plain_cls, pipe_cls = {"llama": (LlamaForCausalLM, LlamaForCausalLMPipe),
                           "qwen2": (Qwen2ForCausalLM, Qwen2ForCausalLMPipe)}[model_type]
    plain = plain_cls.from_pretrained(out_dir, dtype="float32")
    pipe = pipe_cls.from_pretrained(out_dir, dtype="float32")
    ids = paddle.to_tensor(np.random.RandomState(0).randint(3, 100, (2, 12)))
    weights = paddle.to_tensor(np.random.RandomState(1).randn(2, 12, 1).astype("float32"))
    out = {"pipe_class": type(pipe).__name__}
    logits = []
    for model in (plain, pipe):
        res = model(ids)
        res = res.logits if hasattr(res, "logits") else (res[0] if isinstance(res, (tuple, list)) else res)
        (res * weights).sum().backward()
        logits.append(res)
    out["logits_shape"] = list(logits[0].shape)
    out["logits_diff"] = float((logits[0] - logits[1]).abs().max())
    pa = [p for p in plain.parameters() if p.grad is not None]
    pb = [p for p in pipe.parameters() if p.grad is not None]
    assert len(pa) == len(pb), (len(pa), len(pb))
    assert [p.shape for p in pa] == [p.shape for p in pb]
    out["n_grads"] = len(pa)
    out["grad_diff"] = max(float((a.grad - b.grad).abs().max()) for a, b in zip(pa, pb))
    out["grad_max"] = max(float(a.grad.abs().max()) for a in pa)
    return out


def main(out_dir, cases):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    for case in cases:
        model_type, _, variant = case.partition(":")
        try:
            out = run_case(model_type, os.path.join(out_dir, case.replace(":", "_")), tied=variant == "tied")
        except Exception as e:  # noqa: BLE001 - reported per case; the test decides what was expected
            print(f"FAILED {case} {type(e).__name__}: {e}".replace("\n", " "), flush=True)
            continue
        print(f"RESULT {case} " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
