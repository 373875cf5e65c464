"""ppo.models.causal_lm: chunked log-probs from hidden states equal the full-logits path on
real PaddleNLP models (Llama untied head, Qwen2 tied head with GQA and q/k/v biases, LoRA
and DataParallel-style wrappers), values and parameter gradients; plus the shared
position-id / last-token / unwrapping helpers."""
import numpy as np
import paddle
import pytest

from ppo.models.causal_lm import (
    causal_lm_logits,
    causal_lm_token_logprobs,
    final_hidden_states,
    last_token_index,
    lm_head_weight,
    position_ids_from_mask,
)
from ppo.models.loading import apply_lora, find_lora_model, lora_disabled, unwrap_model, unwrap_parallel

V = 97


def llama(tie=False):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(3)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=tie, dtype="float32")
    return LlamaForCausalLM(cfg)


def qwen2():
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    paddle.seed(4)
    cfg = Qwen2Config(vocab_size=V, hidden_size=56, intermediate_size=64, num_hidden_layers=2, num_attention_heads=14,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, dtype="float32")
    return Qwen2ForCausalLM(cfg)


class Wrapper(paddle.nn.Layer):
    """Stands for DataParallel / fleet wrappers: keeps the model in `_layers`, forwards kwargs."""

    def __init__(self, layers):
        super().__init__()
        self._layers = layers

    def forward(self, *args, **kwargs):
        return self._layers(*args, **kwargs)


def batch(seed=0, N=3, T=12, prompt=5):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, V, size=(N, T))
    attn = np.ones((N, T), "int64")
    attn[1, :2] = 0  # left padding
    attn[2, -3:] = 0  # right padding (short response)
    labels = ids.copy()
    labels[:, :prompt] = -100
    labels[attn == 0] = -100
    return paddle.to_tensor(ids), paddle.to_tensor(attn), paddle.to_tensor(labels)


def grads(model):
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def run(model, chunk_size, temperature=1.0):
    ids, attn, labels = batch()
    rng = np.random.default_rng(9)
    a = paddle.to_tensor(rng.normal(size=(3, 11)).astype("float32"))
    b = paddle.to_tensor(rng.normal(size=(3, 11)).astype("float32"))
    for p in model.parameters():
        p.clear_gradient()
    lp, ent = causal_lm_token_logprobs(model, ids, attn, labels, temperature=temperature, chunk_size=chunk_size, with_entropy=True)
    ((lp * a).sum() + (ent * b).sum()).backward()
    return lp.numpy(), ent.numpy(), grads(model)


@pytest.mark.parametrize("build", [llama, qwen2, lambda: llama(tie=True)], ids=["llama_untied", "qwen2_tied_gqa", "llama_tied"])
@pytest.mark.parametrize("chunk_size,temperature", [(4, 1.0), (7, 0.8), (1000, 1.0)])
def test_chunked_matches_full_logits_on_real_models(build, chunk_size, temperature):
    model = build()
    model.eval()
    lp0, ent0, g0 = run(model, 0, temperature)
    lp1, ent1, g1 = run(model, chunk_size, temperature)
    _, _, labels = batch()
    counted = labels.numpy()[:, 1:] >= 0
    assert (lp0[~counted] == 0).all() and (lp1[~counted] == 0).all() and (lp1[counted] < 0).all()
    np.testing.assert_allclose(lp1, lp0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent1, ent0, rtol=1e-5, atol=1e-5)
    assert set(g1) == set(g0) and len(g0) > 0
    head = [n for n in g0 if "lm_head" in n or "embed_tokens" in n]
    assert head, "the head / tied embedding must get a gradient"
    for n in g0:
        np.testing.assert_allclose(g1[n], g0[n], rtol=1e-4, atol=1e-6, err_msg=n)


def test_head_weight_layout_tied_and_untied():
    w, ty = lm_head_weight(llama())
    assert ty is False and w.shape == [32, V]
    q = qwen2()
    w, ty = lm_head_weight(q)
    assert ty is True and w.shape == [V, 56] and w is q.qwen2.embed_tokens.weight


def test_lora_and_wrapper_chunked_matches_full_and_adapter_off():
    """Through a LoRA model inside a DataParallel-like wrapper: equal to full logits, only
    adapter weights get gradients, and the disabled adapter gives the base model's values."""
    base = llama()
    base.eval()
    ids, attn, labels = batch(1)
    with paddle.no_grad():
        base_lp, _ = causal_lm_token_logprobs(base, ids, attn, labels, chunk_size=0)
    lora = apply_lora(base, rank=4, alpha=8)
    for n, p in lora.named_parameters():  # a non-zero adapter, so LoRA changes the outputs
        if "lora_B" in n:
            p.set_value(paddle.full(p.shape, 0.05, p.dtype))
    wrapped = Wrapper(lora)
    assert unwrap_parallel(wrapped) is lora and find_lora_model(wrapped) is lora and unwrap_model(wrapped) is base
    lp0, ent0, g0 = run(wrapped, 0)
    lp1, ent1, g1 = run(wrapped, 5)
    np.testing.assert_allclose(lp1, lp0, rtol=1e-5, atol=1e-5)
    assert g1 and all("lora" in n for n in g1) and set(g1) == set(g0)
    for n in g0:
        np.testing.assert_allclose(g1[n], g0[n], rtol=1e-4, atol=1e-6, err_msg=n)
    assert np.abs(lp1 - base_lp.numpy()).max() > 1e-4
    with paddle.no_grad():
        before, _ = causal_lm_token_logprobs(wrapped, ids, attn, labels, chunk_size=3)
    with paddle.no_grad(), lora_disabled(wrapped) as inner:
        assert inner is lora
        off, _ = causal_lm_token_logprobs(wrapped, ids, attn, labels, chunk_size=3)
    np.testing.assert_allclose(off.numpy(), base_lp.numpy(), rtol=1e-5, atol=1e-5)
    with paddle.no_grad():  # the adapter is back on after the block
        on, _ = causal_lm_token_logprobs(wrapped, ids, attn, labels, chunk_size=3)
    np.testing.assert_array_equal(on.numpy(), before.numpy())
    with pytest.raises(ValueError, match="no LoRA adapter"):
        with lora_disabled(Wrapper(llama())):
            pass


def test_head_restored_and_hidden_states_feed_the_head():
    model = llama()
    ids, attn, _ = batch()
    with paddle.no_grad():
        hidden = final_hidden_states(model, ids, attn)
        logits = causal_lm_logits(model, ids, attn)
    assert hidden.shape == [3, 12, 32] and logits.shape == [3, 12, V]
    np.testing.assert_allclose(paddle.matmul(hidden, model.lm_head.weight).numpy(), logits.numpy(), rtol=1e-5, atol=1e-5)
    assert "forward" not in vars(model.lm_head)


def test_mask_narrows_labels_and_response_slice():
    """A mask on top of labels: only response columns count (PPO layout)."""
    model = llama()
    ids, attn, _ = batch()
    mask = paddle.zeros_like(attn)
    mask[:, 8:] = 1
    mask = mask * attn
    with paddle.no_grad():
        lp, _ = causal_lm_token_logprobs(model, ids, attn, ids, mask=mask, chunk_size=2)
        full, _ = causal_lm_token_logprobs(model, ids, attn, ids, chunk_size=0)
    m = mask.numpy()[:, 1:] != 0
    np.testing.assert_allclose(lp.numpy()[m], full.numpy()[m], rtol=1e-5, atol=1e-5)
    assert (lp.numpy()[~m] == 0).all()


def test_position_ids_and_last_token_index():
    mask = paddle.to_tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [0, 1, 0, 1, 0]])
    np.testing.assert_array_equal(position_ids_from_mask(mask).numpy(), [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2], [0] * 5, [0, 0, 0, 1, 1]])
    np.testing.assert_array_equal(last_token_index(mask).numpy(), [4, 2, 0, 3])


def test_full_logits_path_from_first_counted_column():
    """`first_counted` only trims the full-logits computation; results are unchanged."""
    model = llama()
    ids, attn, _ = batch()
    mask = paddle.zeros_like(attn)
    mask[:, 6:] = 1
    with paddle.no_grad():
        a, ea = causal_lm_token_logprobs(model, ids, attn, ids, mask=mask, chunk_size=0, with_entropy=True)
        b, eb = causal_lm_token_logprobs(model, ids, attn, ids, mask=mask, chunk_size=0, with_entropy=True, first_counted=6)
    assert b.shape == a.shape == [3, 11]
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6)
    np.testing.assert_allclose(eb.numpy(), ea.numpy(), rtol=1e-6)
    assert (a.numpy()[:, :5] == 0).all() and (a.numpy()[:, 5:] < 0).all()


def test_split_head_without_model_parallel_group_is_an_error():
    """A vocabulary split across tensor-parallel ranks takes the vocab-parallel path
    (tests/test_tensor_parallel.py runs it on two processes); a head marked split in a process
    without fleet's model-parallel group is inconsistent and says so."""
    model = llama()
    ids, attn, labels = batch()
    model.lm_head.weight.is_distributed = True
    try:
        assert lm_head_weight(model) == (None, "the LM head's vocabulary is split across tensor-parallel ranks")
        with paddle.no_grad(), pytest.raises(RuntimeError, match="model-parallel group"):
            causal_lm_token_logprobs(model, ids, attn, labels, chunk_size=4)
    finally:
        model.lm_head.weight.is_distributed = False