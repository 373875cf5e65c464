"""Rank worker for the PP=2 test in tests/test_pipeline_models.py (run under paddle.distributed.launch).

`pipeline_pp2_worker.py CKPT OUT STEPS LR` loads CKPT as `LlamaForCausalLMPipe` split over two
pipeline stages on two CPU processes (gloo), runs STEPS `train_batch` calls with SGD(LR) on one
fixed batch (2 micro-batches of 1 row) and the last stage writes the losses to OUT/pp_losses.json.

Two test-only stand-ins make paddle 3.3.1's pipeline schedule run on CPU:
1. `dist.ParallelEnv()._device_id`: PipelineLayer.__init__ reads `ParallelEnv().device_id`,
   which is only set for accelerator builds (AttributeError '_device_id' on CPU); set to 0.
2. p2p: the schedule sends activations with `send_on_calc_stream` / `recv_on_calc_stream`,
   which ProcessGroupGLOO does not implement ("does not support send with sync_op and
   use_calc_stream flag"); replaced by the process group's synchronous send / recv."""
import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

if not hasattr(dist.ParallelEnv(), "_device_id"):
    dist.ParallelEnv._device_id = 0


def install_gloo_p2p():
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication as p2p

    def send(tensor, group, dst, nranks=1, rank_id=0):
        return group.process_group.send(tensor, group.get_group_rank(dst), True)

    def recv(tensor, group, src, nranks=1, rank_id=0):
        return group.process_group.recv(tensor, group.get_group_rank(src), True)

    p2p._send_on_calc_stream = send
    p2p._recv_on_calc_stream = recv


def batch_ids(vocab_size):
    """The fixed batch `[2, 12]` int64 shared by this worker and the plain-model side of the test."""
    return np.random.RandomState(0).randint(3, vocab_size, (2, 12)).astype("int64")


def main(ckpt, out, steps, lr):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": 1}
    fleet.init(is_collective=True, strategy=strategy)
    install_gloo_p2p()
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
