"""The rollout engine on a Qwen3-MoE model (one dense layer, two routed layers of 4 experts, top-2),
an ERNIE 4.5 MoE model (the same shape with its correction bias choosing the experts and two
shared experts), a Qwen2-MoE model (q/k/v biases, a shared expert scaled by its sigmoid gate) and
a Mixtral model (every layer routed): greedy tokens equal the model's own PaddleNLP `generate`, the engine's
log-probs equal the training forward within 1e-4 with the compiled kernels in both layouts and
the pure-Paddle ops, and each expert runs only on the tokens routed to it."""
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


SHAPE = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=128, tie_word_embeddings=True, bos_token_id=1,
             eos_token_id=EOS, pad_token_id=PAD, initializer_range=0.1, dtype="float32")


def random_moe(family="qwen3_moe"):
    """Qwen3-MoE or Qwen2-MoE (``mlp_only_layers=[0]``) or ERNIE 4.5 MoE (``moe_layer_start_index=1``),
    with routers far from uniform and, for ERNIE, a correction bias that overturns some choices, so
    a wrong routing shows in the log-probs; Qwen2-MoE's biases random too."""
    if family == "mixtral":
        from ppo.models.families.mixtral_modeling import MixtralConfig as Config, MixtralForCausalLM as LM

        cfg = Config(**dict(SHAPE, intermediate_size=48), num_local_experts=4, num_experts_per_tok=2)
    elif family == "qwen2_moe":
        from ppo.models.families.qwen2_moe_modeling import Qwen2MoeConfig as Config, Qwen2MoeForCausalLM as LM

        cfg = Config(**SHAPE, rms_norm_eps=1e-6, rope_theta=1e6, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=48, shared_expert_intermediate_size=64, mlp_only_layers=[0])
    elif family == "qwen3_moe":
        from ppo.models.families.qwen3_moe_modeling import Qwen3MoeConfig as Config, Qwen3MoeForCausalLM as LM

        cfg = Config(**SHAPE, rms_norm_eps=1e-6, rope_theta=1e6, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=48, mlp_only_layers=[0], norm_topk_prob=True)
    else:
        from ppo.models.families.ernie45_moe_modeling import Ernie4_5_MoeConfig as Config, Ernie4_5_MoeForCausalLM as LM

        cfg = Config(**SHAPE, rope_theta=5e5, moe_num_experts=4, moe_k=2, moe_intermediate_size=48,
                     moe_num_shared_experts=2)
    paddle.seed(12)
    model = LM(cfg)
    with paddle.no_grad():
        for layer in model.get_decoder().moe_layers():
            layer.mlp.gate.weight.set_value(paddle.randn(layer.mlp.gate.weight.shape) * 0.5)
            if hasattr(layer.mlp, "moe_statics"):
                layer.mlp.moe_statics.e_score_correction_bias.set_value(paddle.randn([1, 4]) * 0.3)
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.set_value(paddle.randn(param.shape) * 0.3)
    model.eval()
    return model


@pytest.fixture(scope="module")
def moe():
    return random_moe()


@pytest.fixture(scope="module")
def ernie_moe():
    return random_moe("ernie4_5_moe")


@pytest.fixture(scope="module")
def qwen2_moe():
    return random_moe("qwen2_moe")


@pytest.fixture(scope="module")
def mixtral():
    return random_moe("mixtral")


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


FAMILIES = ["moe", "ernie_moe", "qwen2_moe", "mixtral"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_tokens_equal_the_models_own_generate(family, prompts, backend, request):
    moe = request.getfixturevalue(family)
    ids, mask = prompts
    with paddle.no_grad():
        ref = moe.generate(input_ids=ids, attention_mask=mask, position_ids=(paddle.cumsum(mask, 1) - 1).clip(min=0),
                           max_new_tokens=12, decode_strategy="greedy_search", eos_token_id=-1, pad_token_id=PAD,
                           use_cache=True)[0].numpy()
    out = _engine(moe, backend).generate(ids, mask, SamplingParams(max_new_tokens=12, min_new_tokens=0, do_sample=False,
                                                                   stop_token_ids=[-1]))
    assert len(set(ref[:, 0].tolist())) > 2
    np.testing.assert_array_equal(out.response_ids.numpy(), ref)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_equal_the_training_forward(family, prompts, backend, request):
    moe = request.getfixturevalue(family)
    ids, mask = prompts
    out = _engine(moe, backend).generate(ids, mask, SamplingParams(max_new_tokens=12, temperature=0.8), seed=4)
    full = paddle.concat([mask, paddle.ones_like(out.response_ids)], axis=1)
    with paddle.no_grad():
        logits = moe(input_ids=out.sequences, attention_mask=full,
                     position_ids=(paddle.cumsum(full, 1) - 1).clip(min=0), return_dict=True).logits
    Tp = ids.shape[1]
    lp = F.log_softmax(logits[:, Tp - 1:-1].astype("float32") / 0.8, axis=-1)
    ref = paddle.take_along_axis(lp, out.response_ids.unsqueeze(-1), axis=-1).squeeze(-1).numpy()
    m = out.response_mask.numpy()
    assert m.sum() > 40 and np.abs((ref - out.response_logprobs.numpy()) * m).max() < 1e-4


def test_the_engine_routes_each_expert_only_its_tokens(moe, prompts, monkeypatch):
    """The engine's dispatch hands each expert only the rows routed to it: per decode step of 8
    rows, top-2 routing gives 16 expert rows in all, not 4 x 8 = 32."""
    from ppo.rollout import moe_mlp

    seen = []
    original = moe_mlp.grouped_dispatch

    def counting(x, weights, indices, experts):
        rows = []

        def counted(expert):
            return lambda h: rows.append(h.shape[0]) or expert(h)

        out = original(x, weights, indices, [counted(e) for e in experts])
        seen.append((x.shape[0], sum(rows)))
        return out

    monkeypatch.setattr(moe_mlp, "grouped_dispatch", counting)
    ids, mask = prompts
    _engine(moe, "paddle").generate(ids, mask, SamplingParams(max_new_tokens=3, do_sample=False), seed=0)
    decode = [s for s in seen if s[0] == 8]
    assert decode and all(rows == 16 for _, rows in decode)
    assert len(seen) == 2 * 3  # two MoE layers x (prefill + 2 decode steps)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_grouped_dispatch_is_the_training_dispatch_bit_for_bit(top_k):
    """One sort instead of a search per expert, the same numbers: 6 experts, one of them
    chosen by no token."""
    from ppo.models.families.moe import dispatch
    from ppo.rollout.moe_mlp import grouped_dispatch

    rng = np.random.RandomState(top_k)
    x = paddle.to_tensor(rng.randn(11, 8).astype("float32"))
    indices = paddle.to_tensor(np.stack([rng.choice(5, top_k, replace=False) for _ in range(11)]).astype("int64"))
    weights = paddle.to_tensor(rng.rand(11, top_k).astype("float32"))
    mats = [paddle.to_tensor(rng.randn(8, 8).astype("float32")) for _ in range(6)]
    experts = [lambda h, w=w: paddle.tanh(paddle.matmul(h, w)) for w in mats]
    np.testing.assert_array_equal(grouped_dispatch(x, weights, indices, experts).numpy(),
                                  dispatch(x, weights, indices, experts).numpy())


def test_lora_wraps_attention_and_experts_not_the_router_and_the_engine_sees_it(prompts):
    """The default LoRA targets wrap the 4 attention projections and each expert's 3 (the dense
    layer's 3 too), never the router; the engine generates with the adapters' current deltas."""
    from ppo.models.families.qwen3_moe_modeling import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from ppo.models.loading import apply_lora

    cfg = Qwen3MoeConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, max_position_embeddings=128, tie_word_embeddings=True,
                         eos_token_id=EOS, pad_token_id=PAD, initializer_range=0.1, dtype="float32", num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=48, mlp_only_layers=[0])
    paddle.seed(13)
    model = Qwen3MoeForCausalLM(cfg)
    model.eval()
    lora = apply_lora(model, rank=4, alpha=8)
    trainable = sorted(n for n, p in lora.named_parameters() if not p.stop_gradient)
    assert len(trainable) == 2 * ((4 + 3) + (4 + 4 * 3)) and not any("mlp.gate." in n for n in trainable)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            param.set_value(paddle.randn(param.shape) * 0.1)
    ids, mask = prompts
    out = _engine(lora, "paddle").generate(ids, mask, SamplingParams(max_new_tokens=6), seed=2)
    full = paddle.concat([mask, paddle.ones_like(out.response_ids)], axis=1)
    with paddle.no_grad():
        logits = lora(input_ids=out.sequences, attention_mask=full, position_ids=(paddle.cumsum(full, 1) - 1).clip(min=0),
                      return_dict=True).logits
    lp = F.log_softmax(logits[:, ids.shape[1] - 1:-1].astype("float32"), axis=-1)
    ref = paddle.take_along_axis(lp, out.response_ids.unsqueeze(-1), axis=-1).squeeze(-1).numpy()
    assert np.abs((ref - out.response_logprobs.numpy()) * out.response_mask.numpy()).max() < 1e-4


@pytest.mark.parametrize("family, chunked", [("moe", False), ("moe", True), ("ernie_moe", False)])
def test_the_engine_records_the_experts_the_training_forward_replays(family, prompts, chunked, request):
    """With `record_routing` the engine returns each token's experts per MoE layer; they are the
    training forward's own top-k at every real token the engine ran (rows dropped as they finish,
    and row chunks, included; padding is routed too but means nothing), -1 where it ran none;
    after the routers move, replaying them keeps the rollout's experts where the router alone
    would pick others (ERNIE's: chosen with its correction bias)."""
    moe = request.getfixturevalue(family)
    ids, mask = prompts
    engine = RolloutEngine(moe, eos_token_id=EOS, pad_token_id=PAD, kernels="paddle", compact_ratio=1.0,
                           record_routing=True, max_num_seqs=3 if chunked else -1)
    out = engine.generate(ids, mask, SamplingParams(max_new_tokens=10, stop_token_ids=list(range(4, 30))), seed=3)
    lengths = out.response_lengths.numpy()
    assert lengths.min() < lengths.max() and lengths.max() > 5  # rows stopped at different steps
    Tp, T = ids.shape[1], out.sequences.shape[1]
    assert len(out.expert_indices) == 2 and out.expert_indices[0].shape == [8, T, 2]
    full = out.attention_mask
    run = dict(input_ids=out.sequences, attention_mask=full, position_ids=(paddle.cumsum(full, 1) - 1).clip(min=0),
               return_dict=True)
    with paddle.no_grad():
        moe(**run)
    own = [i.reshape([8, T, 2]).numpy() for i in moe.last_expert_indices()]
    ran = mask.numpy().astype(bool)
    ran = np.concatenate([ran, np.zeros((8, T - Tp), bool)], axis=1)  # real prompt tokens, then
    for b, n in enumerate(lengths):
        ran[b, Tp:Tp + n - 1] = True  # the responses' (the last sampled token never went through the engine)
    for recorded, mine in zip(out.expert_indices, own):
        recorded = recorded.numpy()
        np.testing.assert_array_equal(np.sort(recorded[ran], -1), np.sort(mine[ran], -1))
        assert (recorded[:, -1] == -1).all()  # the longest row's last token
    replay = [e.reshape([-1, 2]) for e in out.expert_indices]
    saved = [layer.mlp.gate.weight.numpy().copy() for layer in moe.get_decoder().moe_layers()]
    try:
        with paddle.no_grad():
            for layer in moe.get_decoder().moe_layers():  # an update moves the routers
                layer.mlp.gate.weight.set_value(layer.mlp.gate.weight + paddle.randn(layer.mlp.gate.weight.shape) * 0.5)
            moe(**run)
            moved = [i.numpy() for i in moe.last_expert_indices()]
            moe(**run, moe_expert_indices=replay)
            kept = [i.numpy() for i in moe.last_expert_indices()]
    finally:
        for layer, w in zip(moe.get_decoder().moe_layers(), saved):
            layer.mlp.gate.weight.set_value(w)
    flat_ran = ran.reshape(-1)
    for recorded, now, replayed in zip(out.expert_indices, moved, kept):
        recorded = recorded.numpy().reshape(-1, 2)
        np.testing.assert_array_equal(replayed[flat_ran], recorded[flat_ran])
        assert (np.sort(now[flat_ran], -1) != np.sort(recorded[flat_ran], -1)).any()
