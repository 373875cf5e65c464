"""Rollout speed: PaddleNLP `generate` vs the rollout engine, same model / batch / prompts / env.

    python bench/rollout_bench.py                    # both configs, JSON on stdout
    python bench/rollout_bench.py --config tiny      # tiny | 30m | all
    python bench/rollout_bench.py --reps 5 --decode greedy

Configs (random weights, vocab 100; `--config all` runs the two Llama ones):
  tiny: Llama, 4 layers, hidden 256, 4 heads, intermediate 688  (~3.2M parameters)
  30m:  Llama, 9 layers, hidden 512, 8 heads, intermediate 1536 (~30.7M parameters)
  qwen2_moe: Qwen2-MoE, 4 layers, hidden 256, 4 heads (2 KV), 8 experts top-2 of width 256 on
        every layer and a gated shared expert of width 512
  mixtral: Mixtral, 4 layers, hidden 256, 4 heads (2 KV), 8 experts top-2 of width 512
  (`--config moe` runs both). The MoE baselines are PaddleNLP's own classes with the two
  Paddle 3.3.1 breakages mended (`bench/paddlenlp_moe_compat.py`); the engine runs our classes
  (`ppo.models.families`) loaded from the same checkpoint.
Both: batch 16, prompt 32 (rows left-padded by 0-7 tokens), 64 new tokens; every row generates
all 64 (min_new_tokens = max_new_tokens on both sides) so the token counts are identical.

Runs are interleaved (baseline, engine, baseline, engine, ...) after one warm-up each, because
this machine's 2 cores are shared; medians are reported. On an AMD CPU MKL_DEBUG_CPU_TYPE=5 is
set before paddle is imported (`ppo.common.cpu_flags`) and applies to both sides. Reported per config:
  baseline/engine tokens_per_s, speedup (ratio of medians), decode step ms (engine: (wall -
  prefill) / decode steps; baseline: wall / steps), peak_extra_mb (peak paddle host/device
  allocation during the call above what was allocated before it; for the engine plus the KV
  cache and packed-weight buffers it keeps between calls), matmul_bound_step_ms (the model's own
  decode-step matmuls -- q, k, v, o, gate, up, down per layer + lm_head -- at this batch, timed
  as plain paddle.matmul calls in this run), step_vs_matmul_bound, greedy_parity (engine vs
  PaddleNLP greedy tokens on these prompts, 16 tokens). Also tokens per CPU-second of this process
  (time.process_time) and their ratio, speedup_cpu_time: on a shared machine the wall-clock
  numbers move with other processes' load, the CPU-time ones much less.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import argparse
import json
import logging
import statistics
import tempfile
import time
import warnings


warnings.filterwarnings("ignore")

CONFIGS = {
    "tiny": dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=688),
    "30m": dict(hidden_size=512, num_layers=9, num_heads=8, intermediate_size=1536),
    "qwen2_moe": dict(family="qwen2_moe", hidden_size=256, num_layers=4, num_heads=4, num_experts=8, top_k=2,
                      expert_size=256, shared_expert_size=512),
    "mixtral": dict(family="mixtral", hidden_size=256, num_layers=4, num_heads=4, num_experts=8, top_k=2,
                    expert_size=512),
}
CONFIG_GROUPS = {"all": ["tiny", "30m"], "moe": ["qwen2_moe", "mixtral"]}


def _on_gpu():
    import paddle

    return paddle.is_compiled_with_cuda() and paddle.get_device().startswith("gpu")


def _mem_now():
    """Bytes paddle has allocated now (host allocator on CPU, device on GPU)."""
    import paddle
    from paddle.base import core

    if _on_gpu():
        return paddle.device.cuda.memory_allocated()
    return core.host_memory_stat_current_value("Allocated", 0)


def _kept_bytes(engine):
    total = 0
    for v in engine._buffers.values():
        items = v.values() if isinstance(v, dict) else (v if isinstance(v, tuple) else [v])
        for t in items:
            total += int(t.numel()) * t.element_size()
    return total


def _mem_reset():
    """Reset the peak; returns a function giving the peak since."""
    import paddle
    from paddle.base import core

    if _on_gpu():
        paddle.device.cuda.reset_max_memory_allocated()
        return lambda: paddle.device.cuda.max_memory_allocated()
    core.host_memory_stat_reset_peak_value("Allocated", 0)
    return lambda: core.host_memory_stat_peak_value("Allocated", 0)


def make_prompts(batch, prompt_len, seed=0, pad_id=3):
    import numpy as np
    import paddle

    rng = np.random.RandomState(seed)
    ids = rng.randint(4, 100, size=(batch, prompt_len)).astype("int64")
    mask = np.ones((batch, prompt_len), "int64")
    for b in range(batch):
        p = rng.randint(0, 8)
        ids[b, :p] = pad_id
        mask[b, :p] = 0
    return paddle.to_tensor(ids), paddle.to_tensor(mask)


def matmul_bound_step(model, batch, reps=20):
    """Seconds for one decode step's matmuls at this batch: the model's weights, plain paddle.matmul."""
    import paddle

    from ppo.rollout.weights import _decoder, unwrap_model

    lm = unwrap_model(model)
    dec = _decoder(lm)
    ws = []
    for layer in dec.layers:
        a, m = layer.self_attn, layer.mlp
        ws += [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight,
               m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight]
    head = lm.lm_head
    xs = {}
    for w in ws:
        xs.setdefault(w.shape[0], paddle.randn([batch, w.shape[0]]))
    hx = paddle.randn([batch, head.weight.shape[1] if head.transpose_y else head.weight.shape[0]])

    def one():
        for w in ws:
            paddle.matmul(xs[w.shape[0]], w)
        paddle.matmul(hx, head.weight, transpose_y=head.transpose_y)

    with paddle.no_grad():
        for _ in range(3):
            one()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            one()
            times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def _moe_checkpoint(path, kw):
    """Write a random `kw["family"]` model of our classes (experts on every layer) into `path`."""
    import paddle

    from ppo.models.families.mixtral_modeling import MixtralConfig, MixtralForCausalLM
    from ppo.models.families.qwen2_moe_modeling import Qwen2MoeConfig, Qwen2MoeForCausalLM

    paddle.seed(42)
    common = dict(vocab_size=100, hidden_size=kw["hidden_size"], num_hidden_layers=kw["num_layers"],
                  num_attention_heads=kw["num_heads"], num_key_value_heads=kw["num_heads"] // 2,
                  max_position_embeddings=128, num_experts_per_tok=kw["top_k"], output_router_logits=False,
                  tie_word_embeddings=False, dtype="float32", bos_token_id=1, eos_token_id=2, pad_token_id=3)
    if kw["family"] == "qwen2_moe":
        config = Qwen2MoeConfig(**common, num_experts=kw["num_experts"], mlp_only_layers=[], decoder_sparse_step=1,
                                moe_intermediate_size=kw["expert_size"], intermediate_size=kw["shared_expert_size"],
                                shared_expert_intermediate_size=kw["shared_expert_size"], norm_topk_prob=False)
        Qwen2MoeForCausalLM(config).save_pretrained(path)
    else:
        config = MixtralConfig(**common, num_local_experts=kw["num_experts"], intermediate_size=kw["expert_size"])
        MixtralForCausalLM(config).save_pretrained(path)


def load_models(name, kw):
    """(PaddleNLP's model for `generate`, the model the engine runs, extra `generate` kwargs) of
    config `name`: one Llama for both, or for an MoE config PaddleNLP's class (mended) and ours."""
    from paddlenlp.transformers import AutoModelForCausalLM

    from ppo.tiny.factory import build_tiny

    tmp = tempfile.mkdtemp(prefix=f"rollout_bench_{name}_")
    if "family" not in kw:
        build_tiny(tmp, seed=42, max_position_embeddings=128, **kw)
        model = AutoModelForCausalLM.from_pretrained(tmp)
        return model.eval(), model, {}
    import paddlenlp.transformers as nlp

    from bench import paddlenlp_moe_compat
    from ppo.models.adapters import load_causal_lm

    _moe_checkpoint(tmp, kw)
    paddlenlp_moe_compat.apply()
    ours = load_causal_lm(tmp).eval()
    if kw["family"] == "qwen2_moe":
        baseline = nlp.Qwen2MoeForCausalLM.from_pretrained(tmp)
    else:  # PaddleNLP's Mixtral: `num_local_experts`, the hub's expert names (w1, w3, w2)
        from ppo.models.families.mixtral import hub_names

        baseline = nlp.MixtralForCausalLM.from_pretrained(tmp, num_local_experts=kw["num_experts"])
        missing, unexpected = baseline.set_state_dict(hub_names(ours.state_dict()))
        assert not missing and not unexpected, (missing, unexpected)
    return baseline.eval(), ours, dict(paddlenlp_moe_compat.GENERATE_KWARGS)


def run_config(name, reps, decode, batch, prompt_len, new_tokens):
    import paddle

    from ppo.rollout import RolloutEngine, SamplingParams

    kw = CONFIGS[name]
    model, engine_model, generate_kwargs = load_models(name, kw)
    n_params = sum(int(p.numel()) for p in model.parameters())
    ids, mask = make_prompts(batch, prompt_len)
    do_sample = decode == "sampling"
    engine = RolloutEngine(engine_model, eos_token_id=2, pad_token_id=3)
    params = SamplingParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0, top_k=0,
                            top_p=1.0, do_sample=do_sample)

    def run_baseline():
        get_peak, start = _mem_reset(), _mem_now()
        t, c = time.perf_counter(), time.process_time()
        with paddle.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, decode_strategy=decode, top_k=0, top_p=1.0,
                                 temperature=1.0, eos_token_id=2, pad_token_id=3, **generate_kwargs)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        ntok = int(out[0].shape[0] * out[0].shape[1])
        return dict(tokens_per_s=ntok / wall, tokens_per_cpu_s=ntok / cpu, wall_s=wall,
                    step_ms=wall / out[0].shape[1] * 1e3, peak_extra_mb=(get_peak() - start) / 2 ** 20, tokens=ntok)

    def run_engine():
        get_peak, start = _mem_reset(), _mem_now()
        kept = _kept_bytes(engine)  # buffers the engine holds between calls count as its memory
        c = time.process_time()
        out = engine.generate(ids, mask, params, seed=1)
        cpu = time.process_time() - c
        s = out.stats
        return dict(tokens_per_s=s["tokens_per_s"], tokens_per_cpu_s=s["tokens"] / cpu, wall_s=s["wall_s"],
                    step_ms=(s["wall_s"] - s["prefill_s"]) / max(s["decode_steps"], 1) * 1e3,
                    prefill_ms=s["prefill_s"] * 1e3, peak_extra_mb=(get_peak() - start + kept) / 2 ** 20,
                    tokens=s["tokens"])

    # greedy parity on these prompts (engine vs PaddleNLP), 16 tokens
    with paddle.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, decode_strategy="greedy_search",
                             eos_token_id=2, pad_token_id=3, **generate_kwargs)[0].numpy()
    g = engine.generate(ids, mask, SamplingParams(max_new_tokens=16, min_new_tokens=0, do_sample=False))
    gi, gl = g.response_ids.numpy(), g.response_lengths.numpy()
    parity = all((gi[b, : gl[b]] == ref[b, : gl[b]]).all() for b in range(batch))

    run_baseline()
    run_engine()  # warm-up
    base_runs, eng_runs, mm = [], [], []
    for _ in range(reps):
        base_runs.append(run_baseline())
        eng_runs.append(run_engine())
        if "family" not in kw:  # the dense decode-step matmuls; an MoE step's depend on its routing
            mm.append(matmul_bound_step(model, batch)[0])

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    b_tps, e_tps = med(base_runs, "tokens_per_s"), med(eng_runs, "tokens_per_s")
    e_step, mm_step = med(eng_runs, "step_ms"), statistics.median(mm) * 1e3 if mm else None
    return {
        "config": name,
        "model": dict(kw, vocab_size=100, parameters=n_params),
        "batch": batch,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "decode": decode,
        "reps": reps,
        "baseline_paddlenlp_generate": {
            "tokens_per_s": round(b_tps, 1),
            "step_ms": round(med(base_runs, "step_ms"), 3),
            "peak_extra_mb": round(max(r["peak_extra_mb"] for r in base_runs), 2),
            "tokens_per_s_runs": [round(r["tokens_per_s"], 1) for r in base_runs],
            "tokens_per_cpu_s": round(med(base_runs, "tokens_per_cpu_s"), 1),
        },
        "engine": {
            "backend": engine.backend,
            "tokens_per_s": round(e_tps, 1),
            "step_ms": round(e_step, 3),
            "prefill_ms": round(med(eng_runs, "prefill_ms"), 3),
            "peak_extra_mb": round(max(r["peak_extra_mb"] for r in eng_runs), 2),
            "tokens_per_s_runs": [round(r["tokens_per_s"], 1) for r in eng_runs],
            "tokens_per_cpu_s": round(med(eng_runs, "tokens_per_cpu_s"), 1),
        },
        "speedup": round(e_tps / b_tps, 2),
        "speedup_cpu_time": round(med(eng_runs, "tokens_per_cpu_s") / med(base_runs, "tokens_per_cpu_s"), 2),
        "matmul_bound_step_ms": round(mm_step, 3) if mm else None,
        "step_vs_matmul_bound": round(e_step / mm_step, 2) if mm else None,
        "greedy_parity": bool(parity),
    }


def main(argv=None):
    from ppo.common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--config", default="all", choices=[*CONFIGS, *CONFIG_GROUPS])
    parser.add_argument("--reps", type=int, default=3, help="interleaved measured runs per side")
    parser.add_argument("--decode", default="sampling", choices=["sampling", "greedy_search"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    logging.getLogger("paddlenlp").setLevel(logging.ERROR)
    import paddle

    from ppo.kernels import ops_available, unavailable_reason

    paddle.set_device("cpu") if not paddle.is_compiled_with_cuda() else None
    names = CONFIG_GROUPS.get(args.config, [args.config])
    result = {
        "env": {
            "MKL_DEBUG_CPU_TYPE": os.environ.get("MKL_DEBUG_CPU_TYPE"),
            "paddle": paddle.__version__,
            "device": paddle.get_device(),
            "custom_ops": ops_available(),
            "custom_ops_note": None if ops_available() else unavailable_reason(),
            "cpu_count": os.cpu_count(),
        },
        "results": [run_config(n, args.reps, args.decode, args.batch, args.prompt_len, args.new_tokens) for n in names],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
