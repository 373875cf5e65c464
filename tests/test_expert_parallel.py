"""Expert parallelism's pieces in one process (`ppo.strategy.expert`): the token exchange run by
two threads standing for two ranks (their collectives meet at a barrier) against the one-process
MoE block (`ppo.models.families.moe.dispatch`), forward and backward; the expert ownership; the
gradient sync and the clip's norm. The multi-process runs are in tests/test_expert_parallel_launch.py."""
import json
import threading

import numpy as np
import paddle
import pytest

from ppo.models.families.decoder import MLP
from ppo.models.families.moe import dispatch, route
from ppo.strategy.expert.exchange import exchange_dispatch
from ppo.strategy.expert.layout import ExpertLayout


class ThreadComm:
    """`GroupComm`'s two collectives between threads of one process: rank `rank` of `n`."""

    def __init__(self, shared, rank):
        self.shared, self.rank = shared, rank

    def _meet(self, x):
        slots, barrier = self.shared
        slots[self.rank] = x
        barrier.wait()
        seen = list(slots)
        barrier.wait()
        return seen

    def all_gather(self, x):
        seen = self._meet(x.detach().clone())
        return [x if r == self.rank else t for r, t in enumerate(seen)]

    def all_reduce(self, x):
        return paddle.add_n(self._meet(x.detach().clone()))

    def all_reduce_inplace(self, x):
        x.set_value(self.all_reduce(x))


class Config:
    hidden_size, intermediate_size, hidden_act = 8, 16, "silu"


def _model(num_experts=4, seed=0):
    paddle.seed(seed)
    return paddle.nn.Linear(8, num_experts, bias_attr=False), [MLP(Config, 16) for _ in range(num_experts)]


def _grads(layers):
    out = [None if p.grad is None else p.grad.numpy().copy() for layer in layers for p in layer.parameters()]
    for layer in layers:
        layer.clear_gradients()
    return out


def _one_process(gate, experts, xs, top_k, bias=0.0):
    """The block on all rows at once; the router runs on each rank's rows as in the two-rank run."""
    xs = [x.clone() for x in xs]
    for x in xs:
        x.stop_gradient = False
    routed = [route(gate(x) + bias, top_k, True) for x in xs]
    weights, indices = (paddle.concat([r[i] for r in routed]) for i in (0, 1))
    out = dispatch(paddle.concat(xs), weights, indices, experts)
    (out * out).sum().backward()
    return out.numpy(), np.concatenate([x.grad.numpy() for x in xs]), _grads(experts), _grads([gate])


def _per_rank_blocks(gate, experts, xs, top_k, bias=0.0):
    """Each rank's rows through the whole one-process block on their own, as data parallelism
    and an unsharded reference model on that rank compute them (a matmul's last bits depend on
    its row count); the parameters' gradients summed over the ranks."""
    outs, dxs = [], []
    for x in xs:
        if x.shape[0] == 0:  # a rank without rows runs no block
            outs.append(np.zeros([0, x.shape[1]], "float32"))
            dxs.append(np.zeros([0, x.shape[1]], "float32"))
            continue
        x = x.clone()
        x.stop_gradient = False
        weights, indices = route(gate(x) + bias, top_k, True)
        out = dispatch(x, weights, indices, experts)
        (out * out).sum().backward()
        outs.append(out.numpy())
        dxs.append(x.grad.numpy())
    return np.concatenate(outs), np.concatenate(dxs), _grads(experts), _grads([gate])


def _in_threads(fn, n=2):
    """`fn(rank, comm)` on `n` threads meeting at one barrier; their results in rank order."""
    shared, results, errors = ([None] * n, threading.Barrier(n, timeout=20)), [None] * n, []

    def run(r):
        try:
            results[r] = fn(r, ThreadComm(shared, r))
        except Exception as error:  # surfaced below
            errors.append(error)
            shared[1].abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def _copy(layer):
    """A layer of the same class and weights (each thread's rank holds its own parameters)."""
    twin = paddle.nn.Linear(*layer.weight.shape, bias_attr=False) if isinstance(layer, paddle.nn.Linear) else MLP(Config, 16)
    twin.set_state_dict(layer.state_dict())
    return twin


def _two_ranks(gate, experts, xs, top_k, bias=0.0):
    """Each thread: its own copy of the router and of its experts `r * E/2 ...`, its rows `xs[r]`,
    the same loss. Returns the outputs, input gradients, expert gradients (from their owner) and
    the router gradient summed over the ranks, as the data-parallel all-reduce sums it."""
    per = len(experts) // 2
    copies = [(_copy(gate), {e: _copy(experts[e]) for e in range(r * per, (r + 1) * per)}) for r in range(2)]

    def rank(r, comm):
        x = xs[r].clone()
        x.stop_gradient = False
        own_gate, own = copies[r]
        weights, indices = route(own_gate(x) + bias, top_k, True)
        out = exchange_dispatch(x, weights, indices, own, r, comm)
        (out * out).sum().backward()
        return out.numpy(), x.grad.numpy()

    results = _in_threads(rank)
    expert_grads = _grads([copies[e // per][1][e] for e in range(len(experts))])
    gate_grad = _grads([copies[0][0]])[0] + _grads([copies[1][0]])[0]
    return (np.concatenate([o for o, _ in results]), np.concatenate([g for _, g in results]), expert_grads, [gate_grad])


@pytest.mark.parametrize("rows", [(5, 3), (6, 0)])
def test_exchange_equals_each_ranks_own_block(rows):
    """Top-2 of 4 experts, 2 per rank, rank 1 with 0 rows in the second case: the outputs and
    the inputs' gradients equal each rank's own one-process block on its rows bit for bit (each
    token's two terms are added from zero in either layout; each expert runs every rank's rows
    as a matmul of their own), so the trained actor's log-probs equal an unsharded reference's
    on the same rank; the experts' and the router's gradients are those blocks' summed over the
    ranks (float rounding)."""
    gate, experts = _model()
    paddle.seed(1)
    xs = [paddle.randn([n, 8]) for n in rows]
    ref_out, ref_dx, ref_expert, ref_gate = _per_rank_blocks(gate, experts, xs, 2)
    out, dx, expert, gate_grad = _two_ranks(gate, experts, xs, 2)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(dx, ref_dx)
    for got, want in zip(expert, ref_expert):
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gate_grad[0], ref_gate[0], rtol=0, atol=1e-6)
    assert np.abs(ref_gate[0]).max() > 1e-3  # the router does get a gradient through the exchange
    all_out, all_dx, _, _ = _one_process(gate, experts, xs, 2)  # all rows at once: rounding only
    np.testing.assert_allclose(out, all_out, rtol=0, atol=1e-6)
    np.testing.assert_allclose(dx, all_dx, rtol=0, atol=1e-6)


def test_a_rank_whose_experts_no_token_reaches_still_joins_the_backward_exchange():
    """Every token of both ranks routed to experts 0 and 1 (rank 0's, as a trained router can
    send them): rank 1 runs no expert, yet its backward must run the exchange's collectives as
    rank 0's does (before, the gathered rows got no gradient there, rank 1 skipped them and the
    processes' collectives parted ways: a gloo error in the launched runs, a stuck barrier here).
    Outputs and gradients equal each rank's own block's."""
    gate, experts = _model()
    paddle.seed(5)
    xs = [paddle.randn([4, 8]), paddle.randn([3, 8])]
    bias = paddle.to_tensor([20.0, 20.0, 0.0, 0.0])
    ref_out, ref_dx, ref_expert, ref_gate = _per_rank_blocks(gate, experts, xs, 2, bias)
    out, dx, expert, gate_grad = _two_ranks(gate, experts, xs, 2, bias)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(dx, ref_dx)
    assert expert[-1] is None and ref_expert[-1] is None  # expert 3 (rank 1's) ran on no row
    for got, want in zip(expert, ref_expert):
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gate_grad[0], ref_gate[0], rtol=0, atol=1e-6)


def test_top3_differs_from_one_process_by_rounding_only():
    """With 3 experts per token the terms are grouped by rank before the sum: float rounding."""
    gate, experts = _model(num_experts=6, seed=3)
    paddle.seed(4)
    xs = [paddle.randn([7, 8]), paddle.randn([4, 8])]
    ref_out, ref_dx, _, _ = _one_process(gate, experts, xs, 3)
    out, dx, _, _ = _two_ranks(gate, experts, xs, 3)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-6)
    np.testing.assert_allclose(dx, ref_dx, rtol=0, atol=1e-6)


def test_layout_owns_consecutive_experts_inside_groups_carved_from_data_ranks():
    owned = [ExpertLayout(2, rank, 4).owned(8) for rank in range(4)]
    assert owned == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert ExpertLayout(4, 3, 4).owned(8) == [6, 7]
    with pytest.raises(ValueError, match="does not divide num_experts 6"):
        ExpertLayout(4, 0, 4).owned(6)
    with pytest.raises(ValueError, match="does not divide the 3 ranks"):
        ExpertLayout(2, 0, 3)


class Args:
    """The fields the expert-parallel checks read, at PaddleNLP's defaults."""

    def __init__(self, **fields):
        self.expert_parallel_degree, self.use_expert_parallel, self.tensor_parallel_degree = -1, False, -1
        self.pipeline_parallel_degree, self.sharding, self.sharding_parallel_degree = -1, [], -1
        self.__dict__.update(fields)


def _model_dir(tmp_path, name, **config):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_refusals_name_the_key(tmp_path, monkeypatch):
    from ppo.strategy.expert.checks import layout_problems, model_problems

    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    assert layout_problems(Args(expert_parallel_degree=2)) == []
    assert layout_problems(Args(expert_parallel_degree=3)) == [
        "expert_parallel_degree 3 does not divide the world size 4 (the launched processes)"]
    assert layout_problems(Args(expert_parallel_degree=2, tensor_parallel_degree=2)) == []
    assert layout_problems(Args(expert_parallel_degree=4, tensor_parallel_degree=2)) == [
        "expert_parallel_degree 4 does not divide the data-parallel ranks 2 (world size 4 / tensor_parallel_degree 2): "
        "the experts are split over data ranks"]
    assert "sharding other than stage1 over every data rank at sharding_parallel_degree = expert_parallel_degree: not supported yet" in \
        layout_problems(Args(expert_parallel_degree=2, sharding=["stage2"], sharding_parallel_degree=2))[0]
    assert "use_lora: not supported yet" in layout_problems(Args(expert_parallel_degree=2), use_lora=True)[0]
    assert layout_problems(Args(expert_parallel_degree=2), supported=False) == [
        "expert_parallel_degree 2: this entry point does not run expert parallelism (SFT, PPO and GRPO do); set it to 1"]
    assert layout_problems(Args(use_expert_parallel=True)) == [
        "use_expert_parallel: true needs expert_parallel_degree > 1 (the ranks the experts are split over)"]
    assert layout_problems(Args(use_expert_parallel=True, expert_parallel_degree=2)) == []
    assert layout_problems(Args(use_expert_parallel=True, expert_parallel_degree=2), trainer=True) == [
        "use_expert_parallel: true makes PaddleNLP's Trainer write per-rank mixture-of-experts checkpoints; "
        "expert_parallel_degree alone runs expert parallelism here (one-process checkpoints): leave it false"]
    dense = _model_dir(tmp_path, "dense", model_type="llama")
    moe6 = _model_dir(tmp_path, "moe6", model_type="qwen3_moe", num_experts=6)
    moe8 = _model_dir(tmp_path, "moe8", model_type="mixtral", num_local_experts=8)
    dirs = [("actor_model_name_or_path", dense), ("model_name_or_path", moe6), ("model_name_or_path", moe8)]
    assert model_problems(Args(expert_parallel_degree=4), dirs) == [
        f"expert_parallel_degree 4: actor_model_name_or_path {dense} is a dense model (llama, no experts)",
        f"expert_parallel_degree 4 does not divide num_experts 6 of model_name_or_path {moe6}"]
    assert model_problems(Args(expert_parallel_degree=1), dirs) == []


@pytest.mark.parametrize("model_type, key", [("ernie4_5_moe", "moe_num_experts"), ("mixtral", "num_local_experts"),
                                             ("qwen3_moe", "num_experts"), ("qwen2_moe", "num_experts")])
def test_expert_count_refusal_names_the_family_key(tmp_path, model_type, key):
    """The degree must divide the routed expert count read under the family's own key (ERNIE
    4.5's ``moe_num_experts``; Mixtral's ``num_local_experts``, or ``num_experts`` as our saved
    Mixtral configs write it), and the message names that key."""
    from ppo.strategy.expert.checks import model_problems

    six = _model_dir(tmp_path, "six", model_type=model_type, **{key: 6})
    assert model_problems(Args(expert_parallel_degree=4), [("actor_model_name_or_path", six)]) == [
        f"expert_parallel_degree 4 does not divide {key} 6 of actor_model_name_or_path {six}"]
    assert model_problems(Args(expert_parallel_degree=2), [("actor_model_name_or_path", six)]) == []
    saved = _model_dir(tmp_path, "saved", model_type=model_type, num_experts=6)
    assert model_problems(Args(expert_parallel_degree=4), [("model_name_or_path", saved)]) == [
        f"expert_parallel_degree 4 does not divide {key} 6 of model_name_or_path {saved}"]


def test_expert_gradients_are_summed_over_their_holders_and_averaged_over_data_ranks():
    """Expert parallel 2 x data parallel 2: ranks 0 and 2 hold the same experts. Rank 0's tokens
    reached expert 0, rank 2's did not (no gradient there): both end with (g0 + 0) / 4, the
    gradient one process gives it with every rank's loss a quarter of the mean."""
    from ppo.strategy.expert.grads import sync_expert_gradients

    def rank(r, comm):
        layout = ExpertLayout(2, 2 * r, 4)
        layout.grad_comm = comm
        p = paddle.create_parameter([2], "float32")
        if r == 0:
            p.grad = paddle.to_tensor([4.0, -8.0])
        sync_expert_gradients([p], layout, data_world=4)
        return p.grad.numpy()

    for grad in _in_threads(rank):
        np.testing.assert_array_equal(grad, [1.0, -2.0])


def test_the_clip_counts_each_expert_once_and_replicated_weights_once():
    """Two ranks, each with its expert's gradient and the same replicated gradient: the global
    norm is sqrt(|shared|^2 + |e0|^2 + |e1|^2) = sqrt(9 + 16 + 144) = 13 on both, every
    gradient scaled by clip / 13."""
    from ppo.strategy.expert.grads import ExpertClipGrad

    def rank(r, comm):
        layout = ExpertLayout(2, r, 2)
        layout.comm = comm
        shared, expert = paddle.create_parameter([1], "float32"), paddle.create_parameter([1], "float32")
        clip = ExpertClipGrad(6.5, layout, [expert], data_world=2)
        out = clip._dygraph_clip([(shared, paddle.to_tensor([3.0])), (expert, paddle.to_tensor([4.0 if r == 0 else 12.0]))])
        return [float(g.numpy()[0]) for _, g in out]

    assert _in_threads(rank) == [[1.5, 2.0], [1.5, 6.0]]


def test_sharded_blocks_keep_one_process_names_and_gather_back_whole():
    """Two ranks shard the tiny Qwen3-MoE's experts (the second layer is sparse): each keeps its
    two experts under their one-process names, marked for the data-parallel wrapper to skip;
    inside `whole_experts` both hold the model's state dict exactly, and the shards after it."""
    from ppo.models.families.qwen3_moe_modeling import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from ppo.strategy.expert.layout import expert_parameters, shard_experts, whole_experts

    config = Qwen3MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0])
    paddle.seed(0)
    whole = {k: v.numpy() for k, v in Qwen3MoeForCausalLM(config).state_dict().items()}
    models = []
    for _ in range(2):
        model = Qwen3MoeForCausalLM(config)
        model.set_state_dict({k: paddle.to_tensor(v) for k, v in whole.items()})
        models.append(model)

    def rank(r, comm):
        layout = ExpertLayout(2, r, 2)
        layout.comm = comm
        model = models[r]
        assert shard_experts(model, layout, config) == 1
        sharded = sorted(model.state_dict())
        assert all(p.no_sync and p.is_distributed for p in expert_parameters(model))
        with whole_experts(model):
            gathered = {k: v.numpy() for k, v in model.state_dict().items()}
        return sharded, gathered, sorted(model.state_dict())

    for r, (sharded, gathered, after) in enumerate(_in_threads(rank)):
        experts = sorted({k.split("experts.")[1].split(".")[0] for k in sharded if "experts." in k})
        assert experts == (["0", "1"] if r == 0 else ["2", "3"]) and after == sharded
        assert sorted(gathered) == sorted(whole)
        for key, value in whole.items():
            np.testing.assert_array_equal(gathered[key], value, err_msg=key)


MOE_ARCHS = ("qwen3_moe", "ernie45_moe", "qwen2_moe", "mixtral")
"""The tiny factory's mixture-of-experts families: Qwen3-MoE (routed experts only), ERNIE 4.5 MoE
(a shared expert, the selection bias, the router in float32, the norm floor), Qwen2-MoE (a
sigmoid-gated shared expert), Mixtral (every layer sparse)."""


def _tiny_moe(arch):
    """A tiny causal LM of `arch` (4 experts, top-2) with its one-process weights as numpy; ERNIE's
    selection bias made non-zero (it changes which experts some tokens choose)."""
    from ppo.tiny.factory import _FAMILY_MODELS

    paddle.seed(0)
    model = _FAMILY_MODELS[arch](vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                                 max_position_embeddings=64)
    model.eval()
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            p.set_value(paddle.to_tensor([[0.0, 0.04, -0.03, 0.02]]))
    return model.config, {k: v.numpy() for k, v in model.state_dict().items()}


def _loaded(arch, whole):
    from ppo.tiny.factory import _FAMILY_MODELS

    model = _FAMILY_MODELS[arch](vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                                 max_position_embeddings=64)
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in whole.items()})
    model.eval()
    return model


def _forward_backward(model, ids, w):
    """``logits [B, T, V]`` and ``{name: gradient}`` of the loss ``sum(logits * w)``."""
    logits = model(input_ids=ids, return_dict=True).logits
    (logits * w).sum().backward()
    return logits.numpy(), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_sharded_family_model_equals_one_process(arch):
    """Each family's causal LM, its experts sharded over two ranks (threads), each rank its own
    rows: the logits equal the one-process model's on all rows, a routed expert's gradient on
    its owner equals the one-process one, and every replicated parameter (router, shared
    experts, their gate, attention, embeddings) gets the one-process gradient once summed over
    the ranks as data parallelism sums it. Only routed experts are sharded; ERNIE's selection
    bias stays on every rank, untrained, and changes the result (the ranks do use it).
    Measured: logits within 4e-8, gradients within 6e-7 of their largest entry (the dense
    layers' matmuls run on other row counts and the ranks' gradients are summed: rounding)."""
    from ppo.strategy.expert.layout import expert_parameters, shard_experts

    config, whole = _tiny_moe(arch)
    paddle.seed(2)
    ids = [paddle.randint(0, 32, [2, 5]), paddle.randint(0, 32, [1, 5])]
    w = paddle.randn([3, 5, 32])
    ref_logits, ref_grads = _forward_backward(_loaded(arch, whole), paddle.concat(ids), w)
    models = [_loaded(arch, whole) for _ in range(2)]

    def rank(r, comm):
        layout = ExpertLayout(2, r, 2)
        layout.comm = comm
        model = models[r]
        assert shard_experts(model, layout, config) >= 1
        names = {id(p): n for n, p in model.named_parameters()}
        sharded = sorted(names[id(p)] for p in expert_parameters(model))
        rows = slice(0, 2) if r == 0 else slice(2, 3)
        logits, grads = _forward_backward(model, ids[r], w[rows])
        return sharded, logits, grads

    results = _in_threads(rank)
    np.testing.assert_allclose(np.concatenate([r[1] for r in results]), ref_logits, rtol=0, atol=1e-6)
    for r, (sharded, _, grads) in enumerate(results):
        assert sharded and all(".mlp.experts." in n for n in sharded)
        assert {n.split(".mlp.experts.")[1].split(".")[0] for n in sharded} == ({"0", "1"} if r == 0 else {"2", "3"})
        assert not any("bias" in n and "correction" in n for n in grads)
    for name, want in ref_grads.items():
        holders = [grads[name] for sharded, _, grads in results if name in grads]
        owner = [name in sharded for sharded, _, _ in results]
        got = holders[0] if any(owner) else sum(holders)
        assert len(holders) == (1 if any(owner) else 2) or np.abs(want).max() == 0, name
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * max(np.abs(want).max(), 1.0), err_msg=name)
    if arch == "ernie45_moe":
        unbiased = {k: (np.zeros_like(v) if k.endswith("e_score_correction_bias") else v) for k, v in whole.items()}
        logits = _loaded(arch, unbiased)(input_ids=paddle.concat(ids), return_dict=True).logits.numpy()
        assert np.abs(logits - ref_logits).max() > 1e-4  # the bias changed some tokens' experts


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_sharded_family_logits_equal_each_ranks_unsharded_model(arch):
    """Each rank's logits under expert parallelism equal, bit for bit, the unsharded model's on
    that rank's rows: what the reference model (never sharded) computes there, so the KL between
    the trained actor and the reference is exactly 0 where one process has it 0. Before, the
    experts ran the group's gathered rows as one matmul and the last bits moved (a CPU BLAS
    rounds the rows of a 4-row block and the rest differently); AdamW made those ~1e-10 KL
    gradients a few percent of a step, and Mixtral's GRPO under expert parallelism drifted."""
    from ppo.strategy.expert.layout import shard_experts

    config, whole = _tiny_moe(arch)
    paddle.seed(2)
    ids = [paddle.randint(0, 32, [3, 5]), paddle.randint(0, 32, [2, 5])]
    models = [_loaded(arch, whole) for _ in range(2)]

    def rank(r, comm):
        layout = ExpertLayout(2, r, 2)
        layout.comm = comm
        shard_experts(models[r], layout, config)
        with paddle.no_grad():
            return models[r](input_ids=ids[r], return_dict=True).logits.numpy()

    results = _in_threads(rank)
    with paddle.no_grad():
        for r, logits in enumerate(results):
            np.testing.assert_array_equal(logits, _loaded(arch, whole)(input_ids=ids[r], return_dict=True).logits.numpy())


def test_ernie_float32_router_in_a_wider_model_under_expert_parallel():
    """ERNIE 4.5 MoE's router runs in float32 whatever the model's dtype: in a float64 model (the
    mixed precision a CPU can run; it has no bfloat16 matmul) with two ranks as threads, the
    router logits stay float32 and the logits equal the one-process model's within float64
    rounding (measured: 1.4e-17)."""
    from ppo.strategy.expert.layout import shard_experts

    config, whole = _tiny_moe("ernie45_moe")
    paddle.seed(2)
    ids = [paddle.randint(0, 32, [2, 5]), paddle.randint(0, 32, [1, 5])]
    models = [_loaded("ernie45_moe", whole) for _ in range(3)]
    for model in models:
        model.to(dtype="float64")

    def forward(model, rows):
        with paddle.no_grad():
            out = model(input_ids=rows, return_dict=True, output_router_logits=True)
        assert out.logits.dtype == paddle.float64 and [g.dtype for g in out.router_logits] == [paddle.float32]
        return out.logits.numpy()

    ref = np.concatenate([forward(models[2], rows) for rows in ids])

    def rank(r, comm):
        layout = ExpertLayout(2, r, 2)
        layout.comm = comm
        shard_experts(models[r], layout, config)
        return forward(models[r], ids[r])

    np.testing.assert_allclose(np.concatenate(_in_threads(rank)), ref, rtol=0, atol=1e-14)
