"""Rank worker for the PP=2 test in tests/test_pipeline_models.py (run under paddle.distributed.launch).

`pipeline_pp2_worker.py CKPT OUT STEPS LR` loads CKPT as `LlamaForCausalLMPipe` split over two
pipeline stages on two CPU processes (gloo), runs STEPS `train_batch` calls with SGD(LR) on one
fixed batch (2 micro-batches of 1 row) and the last stage writes the losses to OUT/pp_losses.json.

The two test-only stand-ins that make the pipeline schedule run on CPU processes are
`tests/tp_cpu_collectives.install_pipeline` (see its docstring)."""
import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tp_cpu_collectives  # noqa: E402

tp_cpu_collectives.install_pipeline()


def batch_ids(vocab_size):
    """The fixed batch `[2, 12]` int64 shared by this worker and the plain-model side of the test."""
    return np.random.RandomState(0).randint(3, vocab_size, (2, 12)).astype("int64")


def main(ckpt, out, steps, lr):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": 1}
    fleet.init(is_collective=True, strategy=strategy)
    from paddlenlp.transformers import LlamaForCausalLMPipe

    pipe = LlamaForCausalLMPipe.from_pretrained(ckpt, dtype="float32")
    opt = fleet.distributed_optimizer(paddle.optimizer.SGD(learning_rate=lr, parameters=pipe.parameters()))
    model = fleet.distributed_model(pipe)
    ids = paddle.to_tensor(batch_ids(pipe.config.vocab_size))
    losses = [float(model.train_batch([ids, ids], opt)) for _ in range(steps)]
    if fleet.get_hybrid_communicate_group().is_last_stage:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "pp_losses.json"), "w") as f:
            json.dump({"losses": losses, "n_local_params": len(pipe.parameters())}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
