"""The rollout engine (ppo/rollout) against PaddleNLP generate and full forward passes, on tiny
random models: a Llama from ppo.tiny.factory (with its tokenizer and demo prompts) and an
inline Qwen2 (GQA, q/k/v biases, tied embeddings). Every check runs on both kernel sets: the
compiled custom ops ("custom", built on demand; "custom_cols" = the same ops in the transposed
decode layout the CPU path uses for larger models) and the pure-Paddle fallback ("paddle")."""
import logging
import os
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from ppo.rollout import RolloutEngine, SamplingParams
from tests.rollout_ops_helpers import custom_and_fallback_ops
from tests import warm_python

PAD, EOS = 3, 2
BACKENDS = ["custom", "paddle"]


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def _ops_built():
    custom_and_fallback_ops()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from ppo.tiny.factory import build_tiny

    tok, model = build_tiny(str(tmp_path_factory.mktemp("llama")), seed=7, hidden_size=64, num_layers=2,
                            num_heads=4, intermediate_size=128)
    model.eval()
    return tok, model


def _random_qwen2(seed=3):
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                      rope_theta=1e6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD)
    paddle.seed(seed)
    model = Qwen2ForCausalLM(cfg)
    rng = np.random.default_rng(seed)
    for layer in model.qwen2.layers:  # non-zero biases so the bias path is exercised
        for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            lin.bias.set_value(rng.standard_normal(lin.bias.shape).astype("float32") * 0.05)
    model.eval()
    return model


@pytest.fixture(scope="module")
def qwen2():
    return _random_qwen2()


@pytest.fixture(scope="module")
def prompts(llama):
    """Left-padded demo prompts of mixed lengths."""
    tok, _ = llama
    texts = ["k3x9q", "ab", "Hello!", "z", "0123456789", "QwErTy", "x+y=z", "~"]
    rows = [tok(f"USER: Reverse: {t} ASSISTANT:")["input_ids"] for t in texts]
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), PAD, "int64")
    mask = np.zeros((len(rows), T), "int64")
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    assert mask.sum(1).min() < T  # really mixed lengths
    return paddle.to_tensor(ids), paddle.to_tensor(mask)


def _engine(model, backend, **kw):
    """backend: "custom" (compiled ops, the model's layout: these models are small), "custom_cols"
    (compiled ops, the transposed decode layout used on CPU for hidden >= 384), "paddle" (fallback)."""
    if backend == "custom_cols":
        kw.setdefault("decode_layout", "cols")
    eng = RolloutEngine(model, eos_token_id=EOS, pad_token_id=PAD, kernels="paddle" if backend == "paddle" else "custom", **kw)
    assert eng.backend == backend.replace("_cols", "")
    return eng


def _paddlenlp_greedy(model, ids, mask, n, eos=EOS, **kw):
    with paddle.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, decode_strategy="greedy_search",
                             eos_token_id=eos, pad_token_id=PAD, **kw)[0]
    return out.numpy()


def _assert_same_as_reference(out, ref, stop_ids):
    """Tokens equal up to and including the first stop token of the reference; lengths agree."""
    got, lens = out.response_ids.numpy(), out.response_lengths.numpy()
    for b in range(ref.shape[0]):
        r = list(ref[b])
        n = next((i + 1 for i, t in enumerate(r) if t in stop_ids), len(r))
        assert lens[b] == n, f"row {b}: length {lens[b]} != {n}"
        np.testing.assert_array_equal(got[b, :n], ref[b, :n], err_msg=f"row {b}")


def _forward_logprobs(model, out, prompt_mask, temperature):
    seq = out.sequences
    mask = paddle.concat([prompt_mask, paddle.ones_like(out.response_ids)], axis=1)
    with paddle.no_grad():
        logits = model(input_ids=seq, attention_mask=mask, position_ids=(paddle.cumsum(mask, 1) - 1).clip(min=0))
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    Tp = prompt_mask.shape[1]
    lp = F.log_softmax(logits[:, Tp - 1 : -1].astype("float32") / temperature, axis=-1)
    return paddle.take_along_axis(lp, out.response_ids.unsqueeze(-1), axis=-1).squeeze(-1).numpy()


# --------------------------------------------------------------------------- greedy parity
@pytest.mark.parametrize("backend", BACKENDS + ["custom_cols"])
def test_greedy_matches_paddlenlp_llama(llama, prompts, backend):
    _, model = llama
    ids, mask = prompts
    ref = _paddlenlp_greedy(model, ids, mask, 24)
    out = _engine(model, backend).generate(ids, mask, SamplingParams(max_new_tokens=24, min_new_tokens=0,
                                                                     do_sample=False))
    _assert_same_as_reference(out, ref, {EOS})
    np.testing.assert_array_equal(out.sequences.numpy()[:, : ids.shape[1]], ids.numpy())


@pytest.mark.parametrize("backend", BACKENDS + ["custom_cols"])
def test_greedy_matches_paddlenlp_qwen2(qwen2, prompts, backend):
    ids, mask = prompts
    ref = _paddlenlp_greedy(qwen2, ids, mask, 24)
    out = _engine(qwen2, backend).generate(ids, mask, SamplingParams(max_new_tokens=24, min_new_tokens=0,
                                                                     do_sample=False))
    _assert_same_as_reference(out, ref, {EOS})


@pytest.mark.parametrize("backend", BACKENDS + ["custom_cols"])
def test_greedy_matches_paddlenlp_fused_projections_gqa(prompts, backend):
    """PaddleNLP's fuse_attention_qkv (interleaved per kv group) and fuse_attention_ffn layouts, GQA."""
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    ids, mask = prompts
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                      rope_theta=500000.0, bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD)
    cfg.fuse_attention_qkv = True  # (the constructor drops these keywords in paddlenlp 3.0.0b4)
    cfg.fuse_attention_ffn = True
    paddle.seed(5)
    model = LlamaForCausalLM(cfg)
    model.eval()
    assert hasattr(model.llama.layers[0].self_attn, "qkv_proj")
    assert hasattr(model.llama.layers[0].mlp, "gate_up_fused_proj")
    ref = _paddlenlp_greedy(model, ids, mask, 16)
    out = _engine(model, backend).generate(ids, mask, SamplingParams(max_new_tokens=16, min_new_tokens=0,
                                                                     do_sample=False))
    _assert_same_as_reference(out, ref, {EOS})
    lp = _forward_logprobs(model, out, mask, 1.0)
    assert np.abs((lp - out.response_logprobs.numpy()) * out.response_mask.numpy()).max() < 1e-4


def test_paddlenlp_generate_gives_same_greedy_tokens(llama, prompts):
    _, model = llama
    ids, mask = prompts
    p = SamplingParams(max_new_tokens=16, min_new_tokens=0, do_sample=False)
    fast = RolloutEngine(model, EOS, PAD).generate(ids, mask, p)
    slow_engine = RolloutEngine(model, EOS, PAD, use_rollout_engine=False)
    assert slow_engine.backend == "paddlenlp_generate"
    slow = slow_engine.generate(ids, mask, p)
    np.testing.assert_array_equal(fast.response_ids.numpy(), slow.response_ids.numpy())
    np.testing.assert_array_equal(fast.response_lengths.numpy(), slow.response_lengths.numpy())
    np.testing.assert_allclose(fast.response_logprobs.numpy(), slow.response_logprobs.numpy(), atol=1e-4)


# --------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("backend", BACKENDS + ["custom_cols"])
@pytest.mark.parametrize("model_name", ["llama", "qwen2"])
def test_logprobs_match_full_forward(llama, qwen2, prompts, backend, model_name):
    model = llama[1] if model_name == "llama" else qwen2
    ids, mask = prompts
    temperature = 0.7
    out = _engine(model, backend).generate(
        ids, mask, SamplingParams(max_new_tokens=20, temperature=temperature, top_k=30, top_p=0.9), seed=5)
    assert out.logprobs_match_forward
    ref = _forward_logprobs(model, out, mask, temperature)
    m = out.response_mask.numpy()
    got = out.response_logprobs.numpy()
    assert np.abs((ref - got) * m).max() < 1e-4
    assert np.all(got[m == 0] == 0)
    assert np.all(got[m == 1] <= 0)


# --------------------------------------------------------------------------- stopping / min length
def _natural_token(model, ids, mask, step=3, row=0):
    """A token that greedy decoding emits at `step` of `row`, used as a stop token."""
    ref = _paddlenlp_greedy(model, ids, mask, step + 1, eos=-1)
    return int(ref[row, step])


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_token_then_pad_and_mask(llama, prompts, backend):
    _, model = llama
    ids, mask = prompts
    stop = _natural_token(model, ids, mask)
    out = _engine(model, backend).generate(
        ids, mask, SamplingParams(max_new_tokens=12, min_new_tokens=0, do_sample=False, stop_token_ids=[stop]))
    ref = _paddlenlp_greedy(model, ids, mask, 12, eos=stop)
    _assert_same_as_reference(out, ref, {stop})
    r, m, L = out.response_ids.numpy(), out.response_mask.numpy(), out.response_lengths.numpy()
    assert L[0] <= 4 and r[0, L[0] - 1] == stop
    assert out.response_ids.shape[1] == L.max()
    for b in range(r.shape[0]):
        assert np.all(m[b, : L[b]] == 1) and np.all(m[b, L[b]:] == 0)
        assert np.all(r[b, L[b]:] == PAD)
        if L[b] < 12:
            assert r[b, L[b] - 1] == stop and stop not in r[b, : L[b] - 1]
    np.testing.assert_array_equal(out.sequences.numpy()[:, ids.shape[1]:], r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_new_tokens_suppresses_stop_token(llama, prompts, backend):
    _, model = llama
    ids, mask = prompts
    stop = _natural_token(model, ids, mask, step=1)
    out = _engine(model, backend).generate(
        ids, mask, SamplingParams(max_new_tokens=12, min_new_tokens=5, do_sample=False, stop_token_ids=[stop]))
    ref = _paddlenlp_greedy(model, ids, mask, 12, eos=stop, min_new_tokens=5)
    _assert_same_as_reference(out, ref, {stop})
    r, L = out.response_ids.numpy(), out.response_lengths.numpy()
    assert np.all(L >= 6)  # 5 tokens that are not the stop token, then possibly the stop token
    assert not np.any(r[:, :5] == stop)
    # sampling too: the stop token never appears in the first 5 positions
    s = _engine(model, backend).generate(
        ids, mask, SamplingParams(max_new_tokens=8, min_new_tokens=5, stop_token_ids=[stop], temperature=2.0), seed=1)
    assert not np.any(s.response_ids.numpy()[:, :5] == stop)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_sequences_and_strings(llama, prompts, backend):
    tok, model = llama
    ids, mask = prompts
    free = _engine(model, backend).generate(ids, mask, SamplingParams(max_new_tokens=10, min_new_tokens=0,
                                                                      do_sample=False, stop_token_ids=[]))
    seq = [int(t) for t in free.response_ids.numpy()[0, 2:4]]
    out = _engine(model, backend).generate(ids, mask, SamplingParams(
        max_new_tokens=10, min_new_tokens=0, do_sample=False, stop_token_ids=[], stop_sequences=[seq]))
    r, L = out.response_ids.numpy(), out.response_lengths.numpy()
    assert L[0] <= 4 and list(r[0, L[0] - 2 : L[0]]) == seq
    for b in range(len(L)):  # rows are cut exactly at the first occurrence of the sequence
        f = list(free.response_ids.numpy()[b])
        first = next((i + 2 for i in range(len(f) - 1) if f[i : i + 2] == seq), 10)
        assert L[b] == first
    # the same through a stop string (token-level match of its tokenization): pick two generated
    # tokens that are plain characters, so the string tokenizes back to exactly them
    fr = free.response_ids.numpy()
    pair = next(([int(a), int(b)] for row in fr for a, b in zip(row[:-1], row[1:])
                 if all(len(t) == 1 and t.isalnum() for t in tok.convert_ids_to_tokens([int(a), int(b)]))), None)
    assert pair is not None, "no plain-character token pair in the greedy output"
    text = "".join(tok.convert_ids_to_tokens(pair))
    assert tok(text, add_special_tokens=False)["input_ids"] == pair
    by_seq = _engine(model, backend).generate(ids, mask, SamplingParams(
        max_new_tokens=10, min_new_tokens=0, do_sample=False, stop_token_ids=[], stop_sequences=[pair]))
    by_str = _engine(model, backend, tokenizer=tok).generate(ids, mask, SamplingParams(
        max_new_tokens=10, min_new_tokens=0, do_sample=False, stop_token_ids=[], stop_strings=[text]))
    np.testing.assert_array_equal(by_str.response_lengths.numpy(), by_seq.response_lengths.numpy())
    assert by_seq.response_lengths.numpy().min() < 10


# --------------------------------------------------------------------------- repetition penalty
def _reference_greedy_with_penalty(model, ids, mask, n, penalty):
    """Full forward each step; HF/PaddleNLP penalty on real prompt tokens + generated tokens."""
    ids_np, mask_np = ids.numpy(), mask.numpy()
    B = ids_np.shape[0]
    seq, m = ids_np.copy(), mask_np.copy()
    for _ in range(n):
        st, sm = paddle.to_tensor(seq), paddle.to_tensor(m)
        with paddle.no_grad():
            lg = model(input_ids=st, attention_mask=sm, position_ids=(paddle.cumsum(sm, 1) - 1).clip(min=0))
        lg = (lg[0] if isinstance(lg, (tuple, list)) else lg)[:, -1].numpy()
        nxt = []
        for b in range(B):
            x = lg[b].copy()
            seen = {int(t) for t, mm in zip(seq[b], m[b]) if mm}
            for t in seen:
                x[t] = x[t] / penalty if x[t] > 0 else x[t] * penalty
            nxt.append(int(np.argmax(x)))
        seq = np.concatenate([seq, np.array(nxt)[:, None]], 1)
        m = np.concatenate([m, np.ones((B, 1), "int64")], 1)
    return seq[:, ids_np.shape[1]:]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("penalty", [1.8, 0.6])
def test_repetition_penalty_matches_reference(llama, prompts, backend, penalty):
    _, model = llama
    ids, mask = prompts
    n = 10
    out = _engine(model, backend).generate(ids, mask, SamplingParams(
        max_new_tokens=n, min_new_tokens=0, do_sample=False, repetition_penalty=penalty, stop_token_ids=[]))
    ref = _reference_greedy_with_penalty(model, ids, mask, n, penalty)
    np.testing.assert_array_equal(out.response_ids.numpy(), ref)
    assert not out.logprobs_match_forward
    plain = _engine(model, backend).generate(ids, mask, SamplingParams(max_new_tokens=n, min_new_tokens=0,
                                                                       do_sample=False, stop_token_ids=[]))
    assert not np.array_equal(plain.response_ids.numpy(), ref)  # the penalty really changed something
    # log-probs stay those of the raw distribution
    lp = _forward_logprobs(model, out, mask, 1.0)
    assert np.abs(lp - out.response_logprobs.numpy()).max() < 1e-4


# --------------------------------------------------------------------------- seeds, compaction
@pytest.mark.parametrize("backend", BACKENDS)
def test_seed_reproducibility(llama, prompts, backend):
    _, model = llama
    ids, mask = prompts
    p = SamplingParams(max_new_tokens=12, temperature=1.2, top_p=0.95)
    eng = _engine(model, backend)
    a, b, c = eng.generate(ids, mask, p, seed=11), eng.generate(ids, mask, p, seed=11), eng.generate(ids, mask, p,
                                                                                                      seed=12)
    np.testing.assert_array_equal(a.response_ids.numpy(), b.response_ids.numpy())
    np.testing.assert_array_equal(a.response_logprobs.numpy(), b.response_logprobs.numpy())
    assert not np.array_equal(a.response_ids.numpy(), c.response_ids.numpy())


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_of_a_split_batch_sample_like_the_whole_batch(llama, prompts, backend):
    """Data-parallel ranks generating rows [0, k) and [k, B) of one global batch (same seed)
    draw the tokens the whole batch draws in one call; a call with no split is unchanged."""
    _, model = llama
    ids, mask = prompts
    p = SamplingParams(max_new_tokens=10, temperature=1.3, top_p=0.95)
    eng = _engine(model, backend)
    whole = eng.generate(ids, mask, p, seed=11)
    B, k = ids.shape[0], ids.shape[0] // 2
    assert B >= 2
    np.testing.assert_array_equal(eng.generate(ids, mask, p, seed=11, row_offset=0, total_rows=B).response_ids.numpy(),
                                  whole.response_ids.numpy())
    parts = [eng.generate(ids[rows], mask[rows], p, seed=11, row_offset=rows.start, total_rows=B) for rows in
             (slice(0, k), slice(k, B))]
    width = whole.response_ids.shape[1]
    for rows, part in zip((slice(0, k), slice(k, B)), parts):
        got = part.response_ids.numpy()
        np.testing.assert_array_equal(got, whole.response_ids.numpy()[rows][:, : got.shape[1]])
        assert got.shape[1] == width or not whole.response_mask.numpy()[rows][:, got.shape[1]:].any()
    alone = eng.generate(ids[k:], mask[k:], p, seed=11)  # without the offset the rows draw other uniforms
    assert not np.array_equal(alone.response_ids.numpy()[:, :4], whole.response_ids.numpy()[k:, :4])
    with pytest.raises(ValueError, match="do not fit"):
        eng.generate(ids, mask, p, seed=11, row_offset=1, total_rows=B)


def test_custom_and_fallback_sample_identically(llama, prompts):
    _, model = llama
    ids, mask = prompts
    p = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=40)
    a = _engine(model, "custom").generate(ids, mask, p, seed=3)
    b = _engine(model, "paddle").generate(ids, mask, p, seed=3)
    np.testing.assert_array_equal(a.response_ids.numpy(), b.response_ids.numpy())
    np.testing.assert_allclose(a.response_logprobs.numpy(), b.response_logprobs.numpy(), atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS + ["custom_cols"])
def test_compaction_of_finished_rows_changes_nothing(llama, prompts, backend):
    """Rows that finish early are dropped from the batch (cache rows gathered); the result must
    equal a run that keeps them, for greedy and for seeded sampling."""
    _, model = llama
    ids, mask = prompts
    stop = _natural_token(model, ids, mask, step=2)
    for p, seed in [(SamplingParams(max_new_tokens=16, min_new_tokens=0, do_sample=False, stop_token_ids=[stop]), None),
                    (SamplingParams(max_new_tokens=16, min_new_tokens=0, temperature=1.5, stop_token_ids=[stop,
                                                                                                          5, 9]), 4)]:
        a = _engine(model, backend, compact_ratio=0.9).generate(ids, mask, p, seed=seed)
        b = _engine(model, backend, compact_ratio=0.0).generate(ids, mask, p, seed=seed)
        assert a.response_lengths.numpy().min() < 16  # some rows did finish early
        np.testing.assert_array_equal(a.response_ids.numpy(), b.response_ids.numpy())
        np.testing.assert_allclose(a.response_logprobs.numpy(), b.response_logprobs.numpy(), atol=1e-5)
        assert a.stats["decode_steps"] <= 15


def test_all_rows_finished_stops_early(llama, prompts):
    _, model = llama
    ids, mask = prompts
    # the token every row emits first under greedy: everything stops after one token
    first = _paddlenlp_greedy(model, ids, mask, 1, eos=-1)[:, 0]
    out = RolloutEngine(model, EOS, PAD).generate(ids, mask, SamplingParams(
        max_new_tokens=30, min_new_tokens=0, do_sample=False, stop_token_ids=sorted(set(map(int, first)))))
    assert out.response_ids.shape[1] == 1
    assert out.stats["decode_steps"] == 0
    np.testing.assert_array_equal(out.response_lengths.numpy(), 1)


# --------------------------------------------------------------------------- weights: current, LoRA
@pytest.mark.parametrize("layout", ["rows", "cols"])
def test_engine_reads_current_weights_each_call(prompts, layout):
    ids, mask = prompts
    model = _random_qwen2(seed=9)
    eng = RolloutEngine(model, EOS, PAD, decode_layout=layout)  # kept buffers are rewritten each call
    p = SamplingParams(max_new_tokens=10, min_new_tokens=0, do_sample=False)
    before = eng.generate(ids, mask, p)
    w = model.qwen2.layers[0].mlp.down_proj.weight
    rng = np.random.default_rng(0)
    w.set_value(w.numpy() + rng.standard_normal(w.shape).astype("float32") * 0.5)  # "a training step"
    after = eng.generate(ids, mask, p)
    assert not np.array_equal(before.response_ids.numpy(), after.response_ids.numpy())
    _assert_same_as_reference(after, _paddlenlp_greedy(model, ids, mask, 10), {EOS})


@pytest.mark.parametrize("backend", BACKENDS + ["custom_cols"])
def test_lora_model_uses_effective_weights(prompts, backend):
    from paddlenlp.peft import LoRAConfig, LoRAModel
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    ids, mask = prompts
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-6,
                      bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD)
    paddle.seed(21)
    base = LlamaForCausalLM(cfg)
    lora = LoRAModel(base, LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*", ".*down_proj.*"], r=4,
                                      lora_alpha=8))
    rng = np.random.default_rng(0)
    for name, prm in lora.model.named_parameters():
        if "lora_B" in name:
            prm.set_value(rng.standard_normal(prm.shape).astype("float32") * 0.3)
    lora.eval()
    p = SamplingParams(max_new_tokens=12, min_new_tokens=0, do_sample=False)
    ref = _paddlenlp_greedy(lora.model, ids, mask, 12)
    out = _engine(lora, backend).generate(ids, mask, p)
    _assert_same_as_reference(out, ref, {EOS})
    lp = _forward_logprobs(lora.model, out, mask, 1.0)
    assert np.abs((lp - out.response_logprobs.numpy()) * out.response_mask.numpy()).max() < 1e-4
    lora.disable_lora()  # the reference-model trick: base weights only
    ref_base = _paddlenlp_greedy(lora.model, ids, mask, 12)
    _assert_same_as_reference(_engine(lora, backend).generate(ids, mask, p), ref_base, {EOS})
    lora.enable_lora()
    assert not np.array_equal(ref, ref_base)


def test_data_parallel_wrapper_is_unwrapped(llama):
    from ppo.rollout.weights import unwrap_model

    _, model = llama

    class DataParallel(paddle.nn.Layer):  # stands in for paddle.DataParallel (needs a launched job)
        def __init__(self, layers):
            super().__init__()
            self._layers = layers

    assert unwrap_model(DataParallel(model)) is model


# --------------------------------------------------------------------------- output contract, notice
def test_output_contract_and_stats(llama, prompts):
    _, model = llama
    ids, mask = prompts
    out = RolloutEngine(model, EOS, PAD).generate(ids, mask, SamplingParams(max_new_tokens=9), seed=0)
    B, Tp = ids.shape
    Tr = out.response_ids.shape[1]
    assert out.sequences.shape == [B, Tp + Tr] and out.sequences.dtype == paddle.int64
    assert out.response_mask.dtype == paddle.float32 and out.response_logprobs.dtype == paddle.float32
    assert out.response_lengths.dtype == paddle.int64 and out.response_lengths.shape == [B]
    assert Tr == int(out.response_lengths.max()) <= 9
    np.testing.assert_array_equal(out.response_mask.numpy().sum(1), out.response_lengths.numpy())
    np.testing.assert_array_equal(out.attention_mask.numpy(),
                                  np.concatenate([mask.numpy(), out.response_mask.numpy().astype("int64")], 1))
    assert out.stats["tokens"] == int(out.response_lengths.sum())
    for k in ("decode_steps", "wall_s", "tokens_per_s", "prefill_s"):
        assert k in out.stats
    # min_new_tokens=1 by default: no empty / EOS-only responses
    assert np.all(out.response_ids.numpy()[:, 0] != EOS)


def test_missing_ops_fall_back_with_one_notice(tmp_path):
    code = (
        "import logging, numpy as np, paddle\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM\n"
        "from ppo.rollout import RolloutEngine, SamplingParams\n"
        "m = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,"
        " num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))\n"
        "ids = paddle.to_tensor(np.array([[5, 6, 7]], 'int64'))\n"
        "for _ in range(2):\n"
        "    e = RolloutEngine(m, 2, 3)\n"
        "    assert e.backend == 'paddle'\n"
        "    e.generate(ids, None, SamplingParams(max_new_tokens=3), seed=0)\n"
    )
    env = dict(os.environ, PPO_ROLLOUT_OPS_LIB=str(tmp_path / "missing.so"))
    res = warm_python.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("custom ops unavailable") == 1


def test_right_padded_prompts_are_rejected(llama):
    _, model = llama
    ids = paddle.to_tensor(np.array([[5, 6, PAD], [5, 6, 7]], "int64"))
    mask = paddle.to_tensor(np.array([[1, 1, 0], [1, 1, 1]], "int64"))
    with pytest.raises(ValueError, match="LEFT-padded"):
        RolloutEngine(model, EOS, PAD).generate(ids, mask, SamplingParams(max_new_tokens=2))


@pytest.mark.parametrize("backend", ["custom", "custom_cols"])
def test_kept_buffers_across_batch_shapes(llama, prompts, backend):
    """One engine reused over batches of different geometry gives what fresh engines give."""
    _, model = llama
    ids, mask = prompts
    small_ids, small_mask = ids[:3, 2:], mask[:3, 2:]
    eng = _engine(model, backend)
    runs = [(ids, mask, 7), (small_ids, small_mask, 7), (ids, mask, 3)]
    got = [eng.generate(i, m, SamplingParams(max_new_tokens=n, temperature=1.1), seed=2) for i, m, n in runs]
    for (i, m, n), g in zip(runs, got):
        ref = _engine(model, backend, keep_buffers=False).generate(i, m, SamplingParams(max_new_tokens=n,
                                                                                        temperature=1.1), seed=2)
        np.testing.assert_array_equal(g.response_ids.numpy(), ref.response_ids.numpy())
        np.testing.assert_allclose(g.response_logprobs.numpy(), ref.response_logprobs.numpy(), atol=1e-6)
    eng.free_buffers()
    assert not eng._buffers


def test_paddlenlp_generate_in_chunks_draws_each_chunk_afresh(llama, prompts):
    """rollout_max_num_seqs with use_fusemt false: PaddleNLP's generate reseeds Paddle's generator,
    so the chunks of a seeded call must not repeat the first chunk's draws (four copies of one
    prompt in chunks of two would sample two identical pairs)."""
    _, model = llama
    ids, mask = (np.repeat(a[:1], 4, axis=0) for a in prompts)
    p = SamplingParams(max_new_tokens=12, min_new_tokens=12, temperature=2.0, do_sample=True)
    out = RolloutEngine(model, EOS, PAD, use_rollout_engine=False, max_num_seqs=2).generate(ids, mask, p, seed=5)
    got = out.response_ids.numpy()
    assert got.shape == (4, 12)
    assert not np.array_equal(got[:2], got[2:])
    assert len({tuple(r) for r in got}) == 4  # four different samples of the one prompt
