"""Test helper: SGD steps of PaddleNLP's `LlamaForCausalLMPipe` under pipeline parallelism on
CPU processes (run through `tests/tp_entry.py`, which installs the stand-ins).

    python -m paddle.distributed.launch --nproc_per_node 2 tests/tp_entry.py tests/pp_worker.py \\
        MODEL_DIR OUT STEPS LR

Every rank writes `OUT/stage{rank}.npz` (its stage's parameters after the steps, under the
plain model's names) and rank 0 writes `OUT/losses.json` (the loss `train_batch` returned at
each step: the mean over `ACCUMULATE` micro-batches of `MICRO` rows). The batch is
`pipeline_batch()` (shared with the single-process reference in the test).
"""
import json
import os
import sys

import numpy as np

MICRO, ACCUMULATE = 2, 2


def pipeline_batch(vocab_size, length=9, seed=0):
    """`(input_ids, labels)` ``[MICRO * ACCUMULATE, length]``: labels are the next tokens, the
    last position ignored (-100), as PaddleNLP's pretraining criterion expects."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab_size, (MICRO * ACCUMULATE, length + 1))
    labels = ids[:, 1:].copy()
    labels[:, -1] = -100
    return ids[:, :-1], labels


def plain_name(pipe_name, num_layers):
    """`3.self_attn.q_proj.weight` (pipeline layer index) -> `llama.layers.2.self_attn.q_proj.weight`."""
    index, rest = pipe_name.removeprefix("_layers.").split(".", 1)
    index = int(index)
    if index == 0:
        return f"llama.{rest}"
    if index <= num_layers:
        return f"llama.layers.{index - 1}.{rest}"
    if index == num_layers + 1:
        return f"llama.{rest}"
    return f"lm_head.{rest}"


def main(model_dir, out, steps, lr):
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet

    paddle.set_device("cpu")
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2, "sharding_degree": 1}
    strategy.pipeline_configs = {"accumulate_steps": ACCUMULATE, "micro_batch_size": MICRO}
    fleet.init(is_collective=True, strategy=strategy)
    from paddlenlp.transformers.llama.modeling_pp import LlamaForCausalLMPipe

    model = LlamaForCausalLMPipe.from_pretrained(model_dir)
    num_layers, vocab_size = model.config.num_hidden_layers, model.config.vocab_size
    opt = paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters())
    model, opt = fleet.distributed_model(model), fleet.distributed_optimizer(opt)
    ids, labels = pipeline_batch(vocab_size)
    losses = [float(model.train_batch([paddle.to_tensor(ids), paddle.to_tensor(labels)], opt)) for _ in range(steps)]
    os.makedirs(out, exist_ok=True)
    state = {plain_name(n, num_layers): p.numpy() for n, p in model.named_parameters()}
    np.savez(os.path.join(out, f"stage{dist.get_rank()}.npz"), **state)
    if dist.get_rank() == 0:
        json.dump(losses, open(os.path.join(out, "losses.json"), "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
