"""Tokens per second of training steps on length-skewed data, packed against padded, in one
run so the ratios are like for like: SFT steps (`zero_padding`) and GRPO update steps
(`use_remove_padding`).

    python bench/packing_bench.py                 # 256-hidden, 4-layer Llama, lengths 20..1000
    python bench/packing_bench.py --steps 2 --grpo_steps 2 --min_len 16 --max_len 128 --hidden 64

SFT: each step is one forward + backward + AdamW step of the answer-token NLL over the same
`--batch` samples (lengths uniform in [min_len, max_len], prompt a tenth of each), padded with
`SupervisedCollator` or packed into rows of `max_len` tokens with `PackedSupervisedCollator`.

GRPO update: each step is the actor's optimiser step over one rollout batch (`--grpo_prompts`
prompts x `--rollout_n` responses; prompts of 32..96 tokens left-padded, responses of
`min_len + (max_len - min_len) * u**3` tokens, u uniform, so most are short and a few long),
run by the PPO loop's own passes (`PlainPasses.backward_step`: micro-batches of
`--micro_rows` rows, the clipped policy loss plus GRPO's k3 KL loss, backward) then AdamW,
with `use_remove_padding` off and on. The layouts alternate step by step. Reported: real
(non-pad) tokens per second, the median step time, and the token counts each layout
computes. JSON on stdout.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import argparse
import json
import tempfile
import time


import numpy as np  # noqa: E402
import paddle  # noqa: E402

from ppo.algos import kl_loss, ppo_policy_loss  # noqa: E402
from ppo.data.packing import PackedSupervisedCollator  # noqa: E402
from ppo.data.supervised import SupervisedCollator  # noqa: E402
from ppo.models.causal_lm import answer_nll  # noqa: E402
from ppo.models.loading import load_causal_lm  # noqa: E402
from ppo.models.ppo_models import PPOModels  # noqa: E402
from ppo.models.train_patch import patch_overrides  # noqa: E402
from ppo.models.unpadded import pack_padded  # noqa: E402
from ppo.passes import PlainPasses, UpdateLosses  # noqa: E402
from ppo.trainer.updater import minibatch_plan  # noqa: E402
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


def skewed_rollout(rng, prompts, rollout_n, min_len, max_len, vocab):
    """A complete GRPO `Experience` of `prompts * rollout_n` rows: left-padded prompts of
    32..96 tokens, right-padded responses of `min_len + (max_len - min_len) * u**3` tokens,
    group-whitened random scores as advantages, random old and reference log-probs."""
    from ppo.experience import Experience

    N = prompts * rollout_n
    prompt_lens = np.repeat(rng.integers(32, 97, size=prompts), rollout_n)
    response_lens = (min_len + (max_len - min_len) * rng.uniform(size=N) ** 3).astype(int)
    P, Tr = int(prompt_lens.max()), int(response_lens.max())
    mask = np.zeros([N, P + Tr], "int64")
    for n in range(N):
        mask[n, P - prompt_lens[n]:P + response_lens[n]] = 1
    seq = np.where(mask == 1, rng.integers(3, vocab, size=mask.shape), 0).astype("int64")
    response_mask = mask[:, P:].astype("float32")
    scores = rng.normal(size=[prompts, rollout_n])
    adv = ((scores - scores.mean(1, keepdims=True)) / (scores.std(1, keepdims=True) + 1e-6)).reshape(-1, 1)
    t = lambda x, dtype="float32": paddle.to_tensor(np.asarray(x, dtype=dtype))  # noqa: E731
    exp = Experience(
        prompt_len=P, sequences=t(seq, "int64"), attention_mask=t(mask, "int64"),
        position_ids=t(np.clip(mask.cumsum(1) - 1, 0, None), "int64"), response_ids=t(seq[:, P:], "int64"),
        response_mask=t(response_mask), group_ids=t(np.repeat(np.arange(prompts), rollout_n), "int64"),
        src=[""] * N, label=[None] * N, prompt_text=[""] * N, stage="complete",
    )
    exp.old_logprobs = t(-rng.uniform(1, 8, size=[N, Tr]) * response_mask)
    exp.ref_logprobs = t(-rng.uniform(1, 8, size=[N, Tr]) * response_mask)
    exp.advantages = t(np.broadcast_to(adv, [N, Tr]) * response_mask)
    return exp


def grpo_losses(exp):
    """GRPO's actor loss (clipped surrogate + 0.001 x k3 KL), token-mean over the whole batch."""
    tokens = float(exp.response_mask.sum())

    def actor(mb, forward):
        policy, _ = ppo_policy_loss(forward["logprobs"], mb.old_logprobs, mb.advantages, mb.response_mask, num_tokens=tokens)
        kl, _ = kl_loss(forward["logprobs"], mb.ref_logprobs, mb.response_mask, num_tokens=tokens)
        return policy + 0.001 * kl, {}

    return UpdateLosses(actor=actor)


def grpo_bench(args, model):
    """Packed and padded GRPO update steps on the same rollouts; returns the JSON section."""
    optimizer = paddle.optimizer.AdamW(1e-6, parameters=model.parameters())
    models = PPOModels(actor=model, reference=None, reward=None, critic=None)
    passes = {name: PlainPasses(models, model, {}, 1.0, 512, args.micro_rows, remove_padding=name == "packed")
              for name in ("padded", "packed")}
    rng = np.random.default_rng(1)
    times, tokens, real_tokens = {name: [] for name in passes}, {name: 0 for name in passes}, 0
    for step in range(args.grpo_steps + 1):  # step 0 warms up
        exp = skewed_rollout(rng, args.grpo_prompts, args.rollout_n, args.min_len, args.max_len, args.vocab)
        (plan,) = minibatch_plan(len(exp), args.micro_rows, len(exp) // args.micro_rows, seed=step)
        for name, runner in passes.items():
            start = time.perf_counter()
            runner.backward_step(exp, plan, grpo_losses(exp))
            optimizer.step()
            optimizer.clear_grad()
            if step:
                times[name].append(time.perf_counter() - start)
                tokens[name] += computed_tokens(exp, plan, name)
        if step:
            real_tokens += int(exp.attention_mask.sum())
    return section(times, tokens, real_tokens)


def computed_tokens(exp, plan, name):
    """Tokens the layout runs through the model over the step's micro-batches."""
    if name == "padded":
        return len(exp) * int(exp.sequences.shape[1])
    return sum(int(np.prod(pack_padded(exp.sequences.numpy()[rows], exp.attention_mask.numpy()[rows]).input_ids.shape))
               for rows in plan)


def section(times, tokens, real_tokens):
    result = {name: {"real_tokens_per_s": real_tokens / sum(times[name]), "median_step_s": float(np.median(times[name])),
                     "computed_tokens": tokens[name]} for name in times}
    return {"real_tokens": real_tokens, **result,
            "speedup_packed_over_padded": result["packed"]["real_tokens_per_s"] / result["padded"]["real_tokens_per_s"]}


def sft_bench(args, model):
    """Packed and padded SFT steps on the same samples; returns the JSON section."""
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
    return section(times, tokens, real_tokens)


def main(argv=None):
    from ppo.common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--steps", type=int, default=5, help="measured SFT steps per layout")
    parser.add_argument("--batch", type=int, default=8, help="SFT samples per step")
    parser.add_argument("--grpo_steps", type=int, default=3, help="measured GRPO update steps per layout (0: skip)")
    parser.add_argument("--grpo_prompts", type=int, default=4)
    parser.add_argument("--rollout_n", type=int, default=4)
    parser.add_argument("--micro_rows", type=int, default=4, help="rows per GRPO micro-batch")
    parser.add_argument("--min_len", type=int, default=20)
    parser.add_argument("--max_len", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    args = parser.parse_args(argv)
    patch_overrides(True)
    with tempfile.TemporaryDirectory() as tmp:
        build_model(tmp, args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=4,
                    intermediate_size=args.hidden * 8 // 3, max_position_embeddings=args.max_len + 96, seed=0)
        model = load_causal_lm(tmp)
    model.train()
    sft = sft_bench(args, model)
    report = {"settings": vars(args), **sft}  # the SFT numbers at the top level, as before
    if args.grpo_steps:
        report["grpo_update"] = grpo_bench(args, model)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
