"""Tokens per second of SFT training steps on a length-skewed dataset, packed (`zero_padding`)
against padded to each batch's longest sample, in one run so the ratio is like for like.

    python bench/packing_bench.py                 # 256-hidden, 4-layer Llama, lengths 20..1000
    python bench/packing_bench.py --steps 3 --min_len 16 --max_len 256 --hidden 64

Each step is one forward + backward + AdamW step of the answer-token NLL over the same
`--batch` samples (lengths uniform in [min_len, max_len], prompt a tenth of each), padded with
`SupervisedCollator` or packed into rows of `max_len` tokens with `PackedSupervisedCollator`;
the two alternate step by step. Reported: real (non-pad) tokens per second, the median step
time, and the token counts each layout computes. JSON on stdout.
"""
import os

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")  # before paddle

import argparse
import json
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from ppo.data.packing import PackedSupervisedCollator  # noqa: E402
from ppo.data.supervised import SupervisedCollator  # noqa: E402
from ppo.models.causal_lm import answer_nll  # noqa: E402
from ppo.models.loading import load_causal_lm  # noqa: E402
from ppo.models.train_patch import patch_overrides  # noqa: E402
from ppo.tiny.factory import build_model  # noqa: E402


def skewed_samples(rng, count, min_len, max_len, vocab):
    """`count` SFT items with lengths uniform in [min_len, max_len]; the first tenth is prompt."""
    items = []
    for n in rng.integers(min_len, max_len + 1, size=count):
        ids = rng.integers(3, vocab, size=n).astype("int64")
        items.append({"input_ids": ids, "labels": np.where(np.arange(n) < max(n // 10, 1), -100, ids).astype("int64")})
    return items


def timed_step(model, optimizer, batch):
    start = time.perf_counter()
    loss, _ = answer_nll(model, batch["input_ids"], batch["attention_mask"], batch["labels"],
                         position_ids=batch.get("position_ids"))
    loss.backward()
    optimizer.step()
    optimizer.clear_grad()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--min_len", type=int, default=20)
    parser.add_argument("--max_len", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    args = parser.parse_args(argv)
    patch_overrides(True)
    with tempfile.TemporaryDirectory() as tmp:
        build_model(tmp, args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=4,
                    intermediate_size=args.hidden * 8 // 3, max_position_embeddings=args.max_len, seed=0)
        model = load_causal_lm(tmp)
    model.train()
    optimizer = paddle.optimizer.AdamW(1e-4, parameters=model.parameters())
    collators = {"padded": SupervisedCollator(0), "packed": PackedSupervisedCollator(0, args.max_len)}
    rng = np.random.default_rng(0)
    times = {name: [] for name in collators}
    tokens = {name: 0 for name in collators}
    real_tokens = 0
    for step in range(args.steps + 1):  # step 0 warms up
        items = skewed_samples(rng, args.batch, args.min_len, args.max_len, args.vocab)
        for name, collate in collators.items():
            batch = collate(items)
            elapsed = timed_step(model, optimizer, batch)
            if step:
                times[name].append(elapsed)
                tokens[name] += int(np.prod(batch["input_ids"].shape))
        if step:
            real_tokens += sum(len(i["input_ids"]) for i in items)
    result = {name: {"real_tokens_per_s": real_tokens / sum(times[name]), "median_step_s": float(np.median(times[name])),
                     "computed_tokens": tokens[name]} for name in collators}
    report = {"settings": vars(args), "real_tokens": real_tokens, **result,
              "speedup_packed_over_padded": result["packed"]["real_tokens_per_s"] / result["padded"]["real_tokens_per_s"]}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
