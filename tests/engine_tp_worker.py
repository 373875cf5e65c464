"""Test helper: the rollout engine on a tensor-parallel (TP=2) model, both generation layouts.

    python -m paddle.distributed.launch --nproc_per_node 2 tests/tp_entry.py tests/engine_tp_worker.py MODEL_DIR OUT [MODEL_DIR OUT ...]

For each MODEL_DIR OUT pair in turn (one launch serves several models), each rank loads MODEL_DIR split by PaddleNLP's tensor-parallel mappings and writes
`OUT/rank{r}.npz`: for eval_mode `single` and `tensor_parallel`, greedy tokens / log-probs /
lengths and sampled (seed 7) tokens / log-probs of `engine_prompts()`, plus the out-dimension of
this rank's fused q/k/v matrix as the sharded engine holds it.
"""
import os
import sys

import numpy as np

NEW_TOKENS = 8


def engine_prompts(vocab_size):
    """`(input_ids, attention_mask)` ``[4, 6]``, left-padded (pad id 0), ids drawn from [3, vocab)."""
    rng = np.random.default_rng(3)
    ids = rng.integers(3, vocab_size, (4, 6))
    mask = np.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    ids[3, :4], mask[3, :4] = 0, 0
    return ids, mask


def run_engine(model, eval_mode, ids, mask):
    """`{name: array}`: greedy and sampled generations of `RolloutEngine(model, keep_tensor_parallel=...)`
    for the run argument `eval_mode`."""
    from ppo.rollout import RolloutEngine, SamplingParams
    from ppo.rollout.weights import extract_weights

    from ppo.common.parallel_groups import model_parallel_group

    engine = RolloutEngine(model, eos_token_id=2, pad_token_id=0, keep_tensor_parallel=eval_mode == "tensor_parallel",
                          decode_layout="rows", tensor_parallel_group=model_parallel_group())
    out = {}
    for kind, params, seed in (("greedy", SamplingParams(max_new_tokens=NEW_TOKENS, do_sample=False), None),
                               ("sampled", SamplingParams(max_new_tokens=NEW_TOKENS, do_sample=True), 7)):
        res = engine.generate(ids, mask, params=params, seed=seed)
        out[f"{eval_mode}_{kind}_tokens"] = res.response_ids.numpy()
        out[f"{eval_mode}_{kind}_logprobs"] = res.response_logprobs.numpy()
        out[f"{eval_mode}_{kind}_lengths"] = res.response_lengths.numpy()
        out[f"{eval_mode}_{kind}_weights"] = np.array(res.stats["weights"])
    weights = extract_weights(model, sharded=eval_mode == "tensor_parallel", group=model_parallel_group())
    out[f"{eval_mode}_qkv_out"] = np.array(weights.layers[0].qkv.shape[1])
    return out


def main(*model_and_out_dirs):
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet

    from ppo.models.loading import load_causal_lm

    paddle.set_device("cpu")
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    rank = dist.get_rank()
    assert model_and_out_dirs and len(model_and_out_dirs) % 2 == 0, "usage: MODEL_DIR OUT [MODEL_DIR OUT ...]"
    for model_dir, out_dir in zip(model_and_out_dirs[::2], model_and_out_dirs[1::2]):
        model = load_causal_lm(model_dir, tensor_parallel_degree=2, tensor_parallel_rank=rank, tensor_parallel_output=False)
        model.eval()
        ids, mask = engine_prompts(model.config.vocab_size)
        results = {}
        for eval_mode in ("single", "tensor_parallel"):
            results.update(run_engine(model, eval_mode, ids, mask))
        os.makedirs(out_dir, exist_ok=True)
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(*sys.argv[1:])
