"""The rollout engine on the real shapes of ppo.tiny.factory (2 layers, random weights): a
Qwen2.5-0.5B-shaped Qwen2 (vocabulary 151,936, hidden 896, 14 query / 2 KV heads, q/k/v biases,
tied embeddings, rope theta 1e6) and a Llama-3-shaped Llama (vocabulary 128,256, 32 query /
8 KV heads, untied LM head, rope theta 500,000), prompted with their own chat templates.
Greedy decoding must be token-for-token identical to PaddleNLP `generate` on every kernel set."""
import numpy as np
import paddle
import pytest

from ppo.rollout import RolloutEngine, SamplingParams
from tests.rollout_ops_helpers import custom_and_fallback_ops
from ppo.tiny.bpe_tokenizers import build_tokenizer
from ppo.tiny.factory import REAL_SHAPES, real_shape_model

pytestmark = pytest.mark.slow  # real vocabularies (128k-152k): minutes here; tests/test_rollout_engine.py covers the same on tiny shapes

NEW_TOKENS = 12


@pytest.fixture(scope="module", autouse=True)
def _ops_built():
    custom_and_fallback_ops()


@pytest.fixture(scope="module", params=sorted(REAL_SHAPES))
def shaped(request, tmp_path_factory):
    shape = request.param
    tok = build_tokenizer(REAL_SHAPES[shape]["tokenizer"], str(tmp_path_factory.mktemp(shape)))
    model = real_shape_model(shape, tok, num_layers=2, seed=5)
    if shape.startswith("qwen"):  # non-zero biases so the bias path is exercised (init leaves them 0)
        rng = np.random.default_rng(5)
        for layer in model.qwen2.layers:
            for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                lin.bias.set_value(rng.standard_normal(lin.bias.shape).astype("float32") * 0.05)
    conversations = [
        [["What is the capital of France?", "The capital of France is Paris."], ["Reverse: k3x9q"]],
        [["Reverse: ab"]],
        [["How many days are in a week?"]],
    ]
    rows = [tok(tok.apply_chat_template(c, tokenize=False), add_special_tokens=False)["input_ids"] for c in conversations]
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), tok.pad_token_id, "int64")
    mask = np.zeros((len(rows), T), "int64")
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    return shape, tok, model, paddle.to_tensor(ids), paddle.to_tensor(mask)


def test_shape_is_the_real_one(shaped):
    shape, tok, model, _, _ = shaped
    cfg, spec = model.config, REAL_SHAPES[shape]
    for key in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "rope_theta", "tie_word_embeddings"):
        assert getattr(cfg, key) == spec[key], key
    emb = model.get_input_embeddings().weight
    assert emb.shape == [spec["vocab_size"], spec["hidden_size"]]
    assert float(emb[len(tok):].abs().max()) == 0.0 and float(emb[: len(tok)].abs().max()) > 0.0
    if shape.startswith("qwen"):
        assert model.qwen2.layers[0].self_attn.k_proj.bias.shape == [2 * 64]  # 2 KV heads x head_dim 64
        assert model.lm_head.weight is emb or int(np.prod(model.lm_head.weight.shape)) == int(np.prod(emb.shape))
    else:
        assert model.llama.layers[0].self_attn.k_proj.weight.shape == [512, 8 * 16]
        assert model.llama.layers[0].self_attn.q_proj.bias is None


@pytest.mark.parametrize("backend", ["custom", "custom_cols", "paddle"])
def test_greedy_matches_paddlenlp_generate(shaped, backend):
    shape, tok, model, ids, mask = shaped
    with paddle.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                             decode_strategy="greedy_search", eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)[0].numpy()
    kw = {"decode_layout": "cols"} if backend == "custom_cols" else {}
    eng = RolloutEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                        kernels="paddle" if backend == "paddle" else "custom", **kw)
    assert eng.backend == backend.replace("_cols", "")
    out = eng.generate(ids, mask, SamplingParams(max_new_tokens=NEW_TOKENS, min_new_tokens=0, do_sample=False))
    got, lens = out.response_ids.numpy(), out.response_lengths.numpy()
    assert ref.shape[1] >= 4  # the reference really decoded
    for b in range(ref.shape[0]):
        r = list(ref[b])
        n = next((i + 1 for i, t in enumerate(r) if t == tok.eos_token_id), len(r))
        assert lens[b] == n, f"{shape} row {b}: length {lens[b]} != {n}"
        np.testing.assert_array_equal(got[b, :n], ref[b, :n], err_msg=f"{shape} row {b}")
    assert int(got.max()) < len(tok)  # zero rows past the tokenizer never win a greedy argmax
