"""The rollout engine on an ERNIE 4.5 model (interleaved RoPE, head_dim 32 while hidden / heads =
16, GQA 4:1, tied embeddings, rope theta 500,000): greedy tokens equal the model's own PaddleNLP
`generate` (its KV-cache forward) and the engine's log-probs equal a full forward pass, with the
compiled kernels in both layouts and with the pure-Paddle ops; the q/k column reordering that
turns the interleaved rotation into the engine's is what makes them equal; `use_bias` (o_proj and
MLP biases, which the engine does not compute) is refused with the way out named."""
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


def random_ernie(use_bias=False):
    from ppo.models.families.ernie45_modeling import Ernie4_5Config, Ernie4_5ForCausalLM

    cfg = Ernie4_5Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, use_bias=use_bias,
                         bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD, initializer_range=0.1, dtype="float32")
    paddle.seed(13)
    model = Ernie4_5ForCausalLM(cfg)
    model.eval()
    return model


@pytest.fixture(scope="module")
def ernie():
    return random_ernie()


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


def _forward_logprobs(model, prompt_mask, out, temperature):
    full = paddle.concat([prompt_mask, paddle.ones_like(out.response_ids)], axis=1)
    with paddle.no_grad():
        logits = model(input_ids=out.sequences, attention_mask=full,
                       position_ids=(paddle.cumsum(full, 1) - 1).clip(min=0), return_dict=True).logits
    lp = F.log_softmax(logits[:, prompt_mask.shape[1] - 1:-1].astype("float32") / temperature, axis=-1)
    return paddle.take_along_axis(lp, out.response_ids.unsqueeze(-1), axis=-1).squeeze(-1).numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_tokens_equal_the_models_own_generate(ernie, prompts, backend):
    ids, mask = prompts
    with paddle.no_grad():
        ref = ernie.generate(input_ids=ids, attention_mask=mask, position_ids=(paddle.cumsum(mask, 1) - 1).clip(min=0),
                             max_new_tokens=16, decode_strategy="greedy_search", eos_token_id=-1, pad_token_id=PAD,
                             use_cache=True)[0].numpy()
    out = _engine(ernie, backend).generate(ids, mask, SamplingParams(max_new_tokens=16, min_new_tokens=0, do_sample=False,
                                                                     stop_token_ids=[-1]))
    assert len(set(ref[:, 0].tolist())) > 2  # the rows really differ
    np.testing.assert_array_equal(out.response_ids.numpy(), ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_equal_a_full_forward(ernie, prompts, backend):
    ids, mask = prompts
    out = _engine(ernie, backend).generate(ids, mask, SamplingParams(max_new_tokens=12, temperature=0.8), seed=4)
    ref = _forward_logprobs(ernie, mask, out, 0.8)
    m = out.response_mask.numpy()
    assert m.sum() > 40 and np.abs((ref - out.response_logprobs.numpy()) * m).max() < 1e-4


def test_without_the_column_reordering_the_engine_would_differ(ernie, prompts, monkeypatch):
    """The engine's half-split RoPE on the checkpoint's own column order is another model: its
    log-probs of the same tokens move by more than 1e-2."""
    from ppo.rollout import weights

    ids, mask = prompts
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    out = _engine(ernie, "paddle").generate(ids, mask, params, seed=1)
    ref = _forward_logprobs(ernie, mask, out, 1.0)
    monkeypatch.setattr(weights.HalfRotationOrder, "of", classmethod(lambda cls, *a: None))
    again = _engine(ernie, "paddle").generate(ids, mask, params, seed=1)
    m = out.response_mask.numpy()
    assert np.abs((ref - out.response_logprobs.numpy()) * m).max() < 1e-4
    wrong = _forward_logprobs(ernie, mask, again, 1.0)
    different = np.abs((wrong - again.response_logprobs.numpy()) * again.response_mask.numpy()).max()
    assert different > 1e-2, different


def test_projection_biases_are_refused_with_the_way_out(prompts):
    ids, mask = prompts
    with pytest.raises(NotImplementedError, match="o_proj / MLP biases are not supported; .*use_fusemt false"):
        _engine(random_ernie(use_bias=True), "paddle").generate(ids, mask, SamplingParams(max_new_tokens=2))


def test_a_lora_adapter_is_trained_on_the_projections_and_seen_by_the_engine(prompts):
    """The default LoRA targets wrap the seven projections of each layer, and the engine generates
    with the adapter's current delta, reordered with the q/k columns."""
    from ppo.models.loading import apply_lora

    lora = apply_lora(random_ernie(), rank=4, alpha=8)
    trainable = sorted(n for n, p in lora.named_parameters() if not p.stop_gradient)
    assert len(trainable) == 2 * 7 * 2 and not any("norm" in n for n in trainable)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            param.set_value(paddle.randn(param.shape) * 0.1)
    ids, mask = prompts
    out = _engine(lora, "custom").generate(ids, mask, SamplingParams(max_new_tokens=6), seed=2)
    ref = _forward_logprobs(lora, mask, out, 1.0)
    m = out.response_mask.numpy()
    assert m.sum() > 20 and np.abs((ref - out.response_logprobs.numpy()) * m).max() < 1e-4
