"""The rollout engine on a Qwen3 model (per-head q/k RMSNorm before RoPE, head_dim 32 while
hidden / heads = 16, GQA 4:2, tied embeddings): greedy tokens equal the model's own PaddleNLP
`generate` (its KV-cache forward), and the engine's log-probs equal a full forward pass, with
the compiled kernels in both layouts and with the pure-Paddle ops."""
import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from ppo.rollout import RolloutEngine, SamplingParams
from tests.rollout_ops_helpers import custom_and_fallback_ops

PAD, EOS = 3, 2
BACKENDS = ["custom", "custom_cols", "paddle"]


@pytest.fixture(scope="module", autouse=True)
def _ops_built():
    custom_and_fallback_ops()


def random_qwen3():
    from ppo.models.families.qwen3_modeling import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6,
                      rope_theta=1e6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD,
                      initializer_range=0.1, dtype="float32")
    paddle.seed(11)
    model = Qwen3ForCausalLM(cfg)
    rng = np.random.default_rng(11)
    for layer in model.qwen3.layers:  # q/k norm weights far from 1, so a skipped norm shows
        for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
            norm.weight.set_value(rng.uniform(0.3, 3.0, norm.weight.shape).astype("float32"))
    model.eval()
    return model


@pytest.fixture(scope="module")
def qwen3():
    return random_qwen3()


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    lengths = [9, 4, 7, 1, 9, 6, 3, 8]
    ids = np.full((len(lengths), 9), PAD, "int64")
    for i, n in enumerate(lengths):
        ids[i, 9 - n:] = rng.integers(4, 100, n)
    return paddle.to_tensor(ids), paddle.to_tensor((ids != PAD).astype("int64"))


def _engine(model, backend):
    layout = "cols" if backend == "custom_cols" else "rows"
    return RolloutEngine(model, eos_token_id=EOS, pad_token_id=PAD, kernels="paddle" if backend == "paddle" else "custom",
                         decode_layout=layout)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_tokens_equal_the_models_own_generate(qwen3, prompts, backend):
    ids, mask = prompts
    with paddle.no_grad():
        ref = qwen3.generate(input_ids=ids, attention_mask=mask, position_ids=(paddle.cumsum(mask, 1) - 1).clip(min=0),
                             max_new_tokens=16, decode_strategy="greedy_search", eos_token_id=-1, pad_token_id=PAD,
                             use_cache=True)[0].numpy()
    out = _engine(qwen3, backend).generate(ids, mask, SamplingParams(max_new_tokens=16, min_new_tokens=0, do_sample=False,
                                                                     stop_token_ids=[-1]))
    assert len(set(ref[:, 0].tolist())) > 2  # the rows really differ
    np.testing.assert_array_equal(out.response_ids.numpy(), ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_equal_a_full_forward(qwen3, prompts, backend):
    ids, mask = prompts
    out = _engine(qwen3, backend).generate(ids, mask, SamplingParams(max_new_tokens=12, temperature=0.8), seed=4)
    full = paddle.concat([mask, paddle.ones_like(out.response_ids)], axis=1)
    with paddle.no_grad():
        logits = qwen3(input_ids=out.sequences, attention_mask=full,
                       position_ids=(paddle.cumsum(full, 1) - 1).clip(min=0), return_dict=True).logits
    Tp = ids.shape[1]
    lp = F.log_softmax(logits[:, Tp - 1:-1].astype("float32") / 0.8, axis=-1)
    ref = paddle.take_along_axis(lp, out.response_ids.unsqueeze(-1), axis=-1).squeeze(-1).numpy()
    m = out.response_mask.numpy()
    assert m.sum() > 40 and np.abs((ref - out.response_logprobs.numpy()) * m).max() < 1e-4


def test_the_engine_reads_the_q_and_k_norms(qwen3, prompts):
    """Without its q/k norm weights the engine's log-probs would differ: dropping them does."""
    from ppo.rollout import weights

    ids, mask = prompts
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    engine = _engine(qwen3, "paddle")
    with_norms = engine.generate(ids, mask, params, seed=1).response_logprobs.numpy()
    original = weights._qk_norms
    weights._qk_norms = lambda *a: (None, None)
    try:
        without = engine.generate(ids, mask, params, seed=1).response_logprobs.numpy()
    finally:
        weights._qk_norms = original
    assert np.abs(with_norms - without).max() > 1e-2


def test_a_lora_adapter_on_qwen3_is_trained_on_the_projections_and_seen_by_the_engine(prompts):
    """The default LoRA targets wrap the seven projections of each layer (not the q/k norms), and
    the engine generates with the adapter's current delta."""
    from ppo.models.loading import apply_lora

    qwen3 = random_qwen3()  # LoRA rewraps the layers in place: not the shared fixture

    lora = apply_lora(qwen3, rank=4, alpha=8)
    trainable = sorted(n for n, p in lora.named_parameters() if not p.stop_gradient)
    assert len(trainable) == 2 * 7 * 2 and not any("norm" in n for n in trainable)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            param.set_value(paddle.randn(param.shape) * 0.1)
    ids, mask = prompts
    out = _engine(lora, "paddle").generate(ids, mask, SamplingParams(max_new_tokens=6), seed=2)
    full = paddle.concat([mask, paddle.ones_like(out.response_ids)], axis=1)
    with paddle.no_grad():
        logits = lora(input_ids=out.sequences, attention_mask=full, position_ids=(paddle.cumsum(full, 1) - 1).clip(min=0),
                      return_dict=True).logits
        lora.disable_lora()
        base = qwen3(input_ids=out.sequences, attention_mask=full, position_ids=(paddle.cumsum(full, 1) - 1).clip(min=0),
                     return_dict=True).logits
        lora.enable_lora()
    lp = F.log_softmax(logits[:, ids.shape[1] - 1:-1].astype("float32"), axis=-1)
    ref = paddle.take_along_axis(lp, out.response_ids.unsqueeze(-1), axis=-1).squeeze(-1).numpy()
    m = out.response_mask.numpy()
    assert np.abs((ref - out.response_logprobs.numpy()) * m).max() < 1e-4
    assert np.abs((logits - base).numpy()).max() > 1e-3  # the adapter changes the model
