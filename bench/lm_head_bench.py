"""Milliseconds of one forward + backward of `token_logprobs_from_hidden` (log-probs and entropy
of M gathered rows through an [H, V] LM head, chunked) with its Paddle chunks (the twin) and with
the C++ per-chunk kernels of csrc/cpu/train_lm_head.cc, in one run so the ratio is like for like.

    python bench/lm_head_bench.py                       # M=256, H=256, V=100 and 32000
    python bench/lm_head_bench.py --vocab 100 --repeats 5

Both paths use Paddle's matmul for the logits and head gradients; the kernels replace the
elementwise logsumexp / pick / entropy pass and the dZ construction. Median of `--repeats`
runs after one warm-up. JSON on stdout.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import argparse
import json
import sys
import time


import numpy as np  # noqa: E402
import paddle  # noqa: E402

from ppo.algos import token_logprobs_from_hidden  # noqa: E402
from ppo.models import fused_train_ops as F  # noqa: E402
from ppo import kernels  # noqa: E402


def time_case(rows, hidden, vocab, chunk_size, kernels, repeats):
    """Median ms of forward + backward (gradients of hidden states and head) over ``repeats``."""
    rng = np.random.default_rng(0)
    h = paddle.to_tensor(rng.standard_normal((1, rows, hidden)).astype("float32"))
    w = paddle.to_tensor((rng.standard_normal((hidden, vocab)) * 0.05).astype("float32"))
    y = paddle.to_tensor(rng.integers(0, vocab, (1, rows)))
    h.stop_gradient = w.stop_gradient = False
    times = []
    for i in range(repeats + 1):
        h.clear_gradient()
        w.clear_gradient()
        start = time.perf_counter()
        logp, ent = token_logprobs_from_hidden(h, w, y, None, 1.0, chunk_size, False, True, kernels=kernels)
        (logp.sum() + 0.1 * ent.sum()).backward()
        _ = w.grad.numpy()
        if i:
            times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main():
    from ppo.common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--rows", type=int, default=256, help="M, gathered positions")
    parser.add_argument("--hidden", type=int, default=256, help="H")
    parser.add_argument("--vocab", type=int, nargs="+", default=[100, 32000], help="V values")
    parser.add_argument("--chunk_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not kernels.ops_available():
        sys.exit("custom C++ ops are not built: run csrc/build_ops.py first")
    results = []
    for vocab in args.vocab:
        twin = time_case(args.rows, args.hidden, vocab, args.chunk_size, None, args.repeats)
        fused = time_case(args.rows, args.hidden, vocab, args.chunk_size, F.LOGIT_KERNELS, args.repeats)
        results.append({"M": args.rows, "H": args.hidden, "V": vocab, "chunk_size": args.chunk_size,
                        "twin_ms": round(twin, 2), "kernel_ms": round(fused, 2),
                        "twin_over_kernel": round(twin / fused, 2)})
    print(json.dumps({"cpu_count": os.cpu_count(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
