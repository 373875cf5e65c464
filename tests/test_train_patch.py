"""The train patch (ppo/models/train_patch.py) gives PaddleNLP's own RMSNorm and RoPE results
and gradients, whole Llama / Qwen2 models give the same logits, loss and gradients patched and
not (left padding included), and the switch selects Paddle's fused kernels on a CUDA build."""
import numpy as np
import paddle
import pytest
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from paddlenlp.transformers.llama import modeling as llama_modeling
from paddlenlp.transformers.qwen2 import modeling as qwen2_modeling

from ppo.models import train_patch
from ppo.models.causal_lm import position_ids_from_mask
from ppo import kernels

kernels.ensure_built()  # the patch runs the C++ kernels of csrc/cpu/train_ops.cc here


@pytest.fixture(autouse=True)
def unpatched():
    """Each test starts and ends with PaddleNLP's own code."""
    train_patch.remove_train_patch()
    yield
    train_patch.remove_train_patch()


def grads_of(fn, *tensors):
    for t in tensors:
        t.clear_gradient(False)
    out = fn()
    paddle.sum(out * paddle.cos(out)).backward()  # a non-trivial upstream gradient
    return out.numpy(), [t.grad.numpy().copy() for t in tensors]


@pytest.mark.parametrize("shape", [[2, 5, 16], [1, 1, 7], [3, 4, 64]])
def test_rms_norm_matches_paddlenlp(shape):
    config = LlamaConfig(hidden_size=shape[-1], rms_norm_eps=1e-6)
    layer = llama_modeling.LlamaRMSNorm(config)
    layer.weight.set_value(paddle.uniform([shape[-1]], min=0.5, max=1.5))
    x = paddle.randn(shape) * 3
    x.stop_gradient = False
    ref, ref_grads = grads_of(lambda: layer(x), x, layer.weight)
    train_patch.apply_train_patch()
    out, out_grads = grads_of(lambda: layer(x), x, layer.weight)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    for g, r in zip(out_grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_positions", [True, False])
def test_rope_matches_paddlenlp(with_positions):
    B, S, H, D = 2, 6, 3, 8
    q, k = paddle.randn([B, S, H, D]), paddle.randn([B, S, 1, D])
    q.stop_gradient = k.stop_gradient = False
    angles = paddle.arange(S * 2, dtype="float32").unsqueeze(-1) * paddle.linspace(0.1, 1.0, D)
    cos, sin = paddle.cos(angles).reshape([1, S * 2, 1, D]), paddle.sin(angles).reshape([1, S * 2, 1, D])
    positions = paddle.to_tensor([[0, 0, 1, 2, 3, 4], [2, 3, 4, 5, 6, 7]]) if with_positions else None

    def both(fn):
        return lambda: paddle.concat([t.reshape([-1]) for t in fn(q, k, cos, sin, positions)])

    ref, ref_grads = grads_of(both(llama_modeling.apply_rotary_pos_emb), q, k)
    out, out_grads = grads_of(both(train_patch.apply_rotary_pos_emb), q, k)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    for g, r in zip(out_grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def tiny(kind, fuse_ffn=False):
    paddle.seed(3)
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, rms_norm_eps=1e-6)
    if kind == "llama":
        config = LlamaConfig(num_key_value_heads=4, **common)
    else:
        config = Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6, **common)
    config.fuse_attention_ffn = fuse_ffn  # LlamaConfig drops it as a keyword
    return (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(config)


@pytest.mark.parametrize("fuse_ffn", [False, True])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_whole_model_same_logits_loss_and_gradients(kind, fuse_ffn, monkeypatch):
    from ppo.models import fused_train_ops

    called, run = set(), fused_train_ops._run
    monkeypatch.setattr(fused_train_ops, "_run", lambda name, *a: called.add(name) or run(name, *a))
    model = tiny(kind, fuse_ffn)
    ids = paddle.to_tensor(np.random.default_rng(0).integers(3, 97, size=(3, 9)))
    mask = paddle.to_tensor(np.array([[1] * 9, [0, 0, 0] + [1] * 6, [0] * 5 + [1] * 4]))  # left padding

    def step():
        model.clear_gradients()
        logits = model(ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), return_dict=True).logits
        keep = mask.astype("float32").unsqueeze(-1)
        loss = paddle.sum(paddle.nn.functional.log_softmax(logits, -1) * keep) / keep.sum()
        loss.backward()
        return logits.numpy() * keep.numpy(), float(loss), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}

    ref_logits, ref_loss, ref_grads = step()
    assert train_patch.apply_train_patch()
    assert llama_modeling.swiglu is train_patch.fused_swiglu and kernels.ops_available()
    logits, loss, grads = step()
    swiglu_op = "train_swiglu_fused" if fuse_ffn else "train_swiglu"
    assert called == {"train_rms_norm", "train_rope", "train_sdpa", swiglu_op}  # every layer op ran as a kernel
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for name in ref_grads:
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_switch_selects_cpu_patch_or_fused_gpu_kernels():
    assert train_patch.patch_overrides(True, cuda=True) == {"use_fused_rms_norm": True, "use_fused_rope": True}
    assert train_patch.patch_overrides(True, cuda=True, dtype="bfloat16") == {
        "use_fused_rms_norm": True, "use_fused_rope": True, "use_flash_attention": True}
    assert llama_modeling.apply_rotary_pos_emb is not train_patch.apply_rotary_pos_emb  # not installed on CUDA
    assert train_patch.patch_overrides(True, cuda=False) == {}
    assert llama_modeling.apply_rotary_pos_emb is train_patch.apply_rotary_pos_emb
    assert qwen2_modeling.apply_rotary_pos_emb is train_patch.apply_rotary_pos_emb
    assert not train_patch.apply_train_patch()  # idempotent
    assert train_patch.patch_overrides(False, cuda=False) == {}
    assert llama_modeling.apply_rotary_pos_emb is not train_patch.apply_rotary_pos_emb  # removed
