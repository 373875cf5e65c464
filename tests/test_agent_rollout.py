"""The multi-turn rollout (ppo/agents/rollout.py on ppo/rollout/multi_turn.py) on the tiny random
Llama: KV-cache continuation after tool turns against a fresh prefill of the whole trajectory
and against the model's own forward pass, rows that do not wait for another row's slow tool,
the turn limits, and the refusal of PaddleNLP's generate path. The kernels: the compiled
custom ops ("custom"; "custom_cols" = the transposed decode layout) and the pure-Paddle
fallback ("paddle")."""
import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from ppo.agents import AgentSettings, TaggedFormat, collate_trajectories, policy_mask, rollout_trajectories
from ppo.rollout import RolloutEngine, SamplingParams
from ppo.rollout.multi_turn import prefill_logprobs
from tests.rollout_ops_helpers import custom_and_fallback_ops
from ppo.rollout.weights import unwrap_model
from tests.agent_helpers import EOS, PAD, EchoEnv, tiny_llama

BACKENDS = ["custom", "custom_cols", "paddle"]
TEMPLATE = "USER: {input} ASSISTANT:"


@pytest.fixture(scope="module", autouse=True)
def _ops_built():
    custom_and_fallback_ops()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama"))


def _engine(model, backend):
    kw = {"decode_layout": "cols"} if backend == "custom_cols" else {}
    return RolloutEngine(model, eos_token_id=EOS, pad_token_id=PAD, kernels="paddle" if backend == "paddle" else "custom", **kw)


def _records(n, **extra):
    return [{"src": f"Reverse: {'abcdefgh'[: 2 + i % 5]}", "i": i, **extra} for i in range(n)]


def _run(llama, backend="custom", records=None, turns=3, params=None, pause="row", **args):
    tok, model = llama
    agent_args = AgentSettings(**{"max_turns": 4, "max_total_len": 120, **args})
    params = params or SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=0.8)
    return rollout_trajectories(_engine(model, backend), records or _records(5), agent_args, TaggedFormat(tok, TEMPLATE),
                                params, seed=3, env_factory=lambda: EchoEnv(turns=turns), pause=pause)


def _model_logprobs(model, ids, temperature):
    x = paddle.to_tensor(np.asarray(ids, np.int64)[None, :])
    with paddle.no_grad():
        logits = model(input_ids=x, position_ids=paddle.arange(len(ids), dtype="int64").unsqueeze(0))
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    lp = F.log_softmax(logits[0, :-1].astype("float32") / temperature, axis=-1)
    return paddle.take_along_axis(lp, x[0, 1:].unsqueeze(-1), axis=-1).squeeze(-1).numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_continuation_after_tool_turns_equals_a_fresh_prefill(llama, backend):
    """Rows of different answer lengths, fed mid-batch onto their caches: each policy token's
    log-prob equals one pass of the same kernels over the whole trajectory (rtol 1e-5), and the
    model's own forward pass (1e-4, the single-turn engine's bound)."""
    tok, model = llama
    records = [{**r, "sleep": [0.3, 0.0] if r["i"] == 1 else 0.0} for r in _records(6)]  # row 1 pauses
    for r in records[3:]:
        r["turns"] = 1  # done early: the batch is compacted while rows 0-2 go on
    result = _run(llama, backend, records=records)
    engine = _engine(model, backend)
    fed_chunks = 0
    assert [t.num_turns for t in result.trajectories] == [3, 3, 3, 1, 1, 1]
    for traj in result.trajectories:
        assert [s.kind for s in traj.segments].count("tool") == traj.num_turns - 1
        ids = traj.token_ids
        positions = np.nonzero(np.asarray([k for s in traj.segments for k in [s.is_policy] * len(s.token_ids)]))[0]
        got = traj.policy_logprobs()[positions]
        fresh = prefill_logprobs(engine, unwrap_model(model), ids, temperature=0.8)[positions - 1]
        np.testing.assert_allclose(got, fresh, rtol=1e-5, atol=1e-6)
        reference = _model_logprobs(model, ids, 0.8)[positions - 1]
        assert np.abs(got - reference).max() < 1e-4
        fed_chunks += len(traj.segments)
    assert fed_chunks and result.stats["fed_tokens"] > result.stats["tokens"]  # answers were fed, not re-prefilled
    lengths = {len(t.token_ids) for t in result.trajectories}
    assert len(lengths) > 1  # rows really diverged
    # (the cache's length is not checked: how many steps the other rows take while row 1 sleeps
    # depends on the machine's speed; 196-236 slots idle here, 101 under a load of 9)
    assert result.stats["chunk_rows"] < 6 * result.stats["chunk_passes"]  # some answers fed to a few rows only
    assert result.stats["compactions"] >= 1


@pytest.mark.parametrize("backend", ["custom", "paddle"])
def test_kv_continuation_on_a_gqa_model_with_qkv_biases(llama, backend):
    """The same check on a Qwen2 (grouped KV heads, q/k/v biases, tied embeddings)."""
    from tests.agent_helpers import random_qwen2

    tok, _ = llama
    model = random_qwen2()
    records = [{**r, "sleep": [0.3, 0.0] if r["i"] == 2 else 0.0} for r in _records(4)]
    result = _run((tok, model), backend, records=records)
    engine = _engine(model, backend)
    for traj in result.trajectories:
        ids = traj.token_ids
        positions = np.nonzero(policy_mask(traj.segments))[0]
        got = traj.policy_logprobs()[positions]
        fresh = prefill_logprobs(engine, unwrap_model(model), ids, temperature=0.8)[positions - 1]
        np.testing.assert_allclose(got, fresh, rtol=1e-5, atol=1e-6)
        assert np.abs(got - _model_logprobs(model, ids, 0.8)[positions - 1]).max() < 1e-4


def test_row_pausing_does_not_change_any_token(llama):
    """Each row draws its own uniforms: pausing rows (or not) changes scheduling, never samples."""
    a, b = _run(llama, pause="row"), _run(llama, pause="batch")
    for x, y in zip(a.trajectories, b.trajectories):
        assert x.token_ids == y.token_ids
        np.testing.assert_allclose(x.policy_logprobs(), y.policy_logprobs(), rtol=1e-5, atol=1e-6)


def test_a_slow_tool_does_not_delay_the_other_rows(llama):
    """Row 0's first tool call sleeps; the other rows finish all their turns before it returns.
    In the turn-synchronous baseline they wait for it (so the check can fail)."""
    slow = 2.0
    records = [{**r, "sleep": [slow, 0, 0] if r["i"] == 0 else 0.0} for r in _records(4)]
    for pause in ("row", "batch"):
        result = _run(llama, records=records, turns=3, pause=pause)
        slow_back = result.trajectories[0].tool_calls[0]["end"]
        others_last = max(t.token_times[-1] for t in result.trajectories[1:])
        others_first = min(t.token_times[0] for t in result.trajectories[1:])
        assert others_first < slow_back
        if pause == "row":
            assert others_last < slow_back, "a row waited for another row's tool"
            assert all(t.num_turns == 3 for t in result.trajectories)
        else:
            assert others_last > slow_back


def test_max_turns_and_max_total_len_truncate(llama):
    by_turns = _run(llama, turns=10, max_turns=2)
    assert all(t.truncated and t.stop_reason == "max_turns" and t.num_turns == 2 for t in by_turns.trajectories)
    assert by_turns.metrics["agent/truncated_frac"] == 1.0
    by_length = _run(llama, turns=10, max_turns=10, max_total_len=40)
    for t in by_length.trajectories:
        assert t.truncated and t.stop_reason == "max_total_len" and len(t.token_ids) <= 40
        assert t.segments[-1].is_policy  # a cut answer is never fed


def test_eos_ends_a_turn_and_the_batch_reports_its_counts(llama):
    """A stop token ends the turn (env.step is called with it); metrics and stats come back."""
    params = SamplingParams(max_new_tokens=8, min_new_tokens=0, temperature=1.0, stop_token_ids=[EOS, 10, 11, 12])
    result = _run(llama, params=params, turns=2)
    ends = [s.token_ids[-1] for t in result.trajectories for s in t.policy_segments]
    lengths = [len(s.token_ids) for t in result.trajectories for s in t.policy_segments]
    assert all(e in (EOS, 10, 11, 12) or n == 8 for e, n in zip(ends, lengths))
    assert result.metrics["agent/turns_mean"] == 2.0 and result.metrics["agent/tool_calls_mean"] == 1.0
    assert result.stats["tokens"] == sum(lengths)


def test_collated_batch_trains_only_on_policy_tokens(llama):
    """Layout of the batch, rewards by turn_reward_mode, and the gradient of a PPO loss on the
    collated batch: zero at every environment-fed position, non-zero at policy ones."""
    from ppo.algos.losses import ppo_policy_loss, token_logprobs
    from tests.agent_helpers import positions_of

    tok, model = llama
    result = _run(llama, turns=3)
    batch = collate_trajectories(result.trajectories, PAD, "per_turn")
    final = collate_trajectories(result.trajectories, PAD, "final")
    np.testing.assert_allclose(batch.rewards.sum(1), [2.0] * 5)  # 0.5 + 0.5 + 1.0
    assert (final.rewards != 0).sum(1).tolist() == [1] * 5 and (batch.rewards != 0).sum(1).tolist() == [3] * 5
    Tp = batch.sequences.shape[1] - batch.response_mask.shape[1]
    seq = paddle.to_tensor(batch.sequences)
    mask = paddle.to_tensor(batch.attention_mask)
    logits = model(input_ids=seq, attention_mask=mask, position_ids=(paddle.cumsum(mask, 1) - 1).clip(min=0))
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    logits = logits[:, Tp - 1: -1]
    logits.stop_gradient = False
    logp = token_logprobs(logits, seq[:, Tp:], 0.8)
    old = paddle.to_tensor(batch.response_logprobs)
    adv = paddle.ones_like(old)
    loss, _ = ppo_policy_loss(logp, old, adv, paddle.to_tensor(batch.response_mask))
    grad = paddle.grad(loss, logits)[0].abs().sum(-1).numpy()  # [B, Tr]
    for b, traj in enumerate(result.trajectories):
        n = traj.prompt_length
        for kind in ("glue", "tool"):
            pos = positions_of(traj, kind) - n
            assert len(pos) and np.all(grad[b, pos] == 0.0), kind
        assert np.all(grad[b, positions_of(traj, "policy") - n] > 0)
        assert np.all(grad[b, len(traj.token_ids) - n:] == 0.0)  # padding


def test_paddlenlp_generate_path_refuses_multi_turn(llama):
    tok, model = llama
    engine = RolloutEngine(model, eos_token_id=EOS, pad_token_id=PAD, use_rollout_engine=False)
    with pytest.raises(NotImplementedError, match="use_fusemt"):
        rollout_trajectories(engine, _records(1), AgentSettings(env_name="tools"), TaggedFormat(tok, TEMPLATE),
                             SamplingParams())


@pytest.mark.parametrize("backend", ["custom", "paddle"])
def test_decoder_packs_the_rows_tokens_when_the_slots_run_out(llama, backend):
    """Rows fed in turns leave two thirds of the slots empty; when the cache runs out they are
    packed to its front instead of doubling it, and every log-prob still equals a fresh prefill."""
    from ppo.rollout.multi_turn import SlotDecoder

    tok, model = llama
    engine = _engine(model, backend)
    params = SamplingParams(max_new_tokens=64, min_new_tokens=64, temperature=0.8)
    with paddle.no_grad():
        decoder = SlotDecoder(engine, unwrap_model(model), 3, 64, params, seed=2)
        seqs = {r: tok(f"USER: Reverse: {'xyz'[: r + 1]} ASSISTANT:")["input_ids"] for r in range(3)}
        pending, logprobs = {r: list(s) for r, s in seqs.items()}, {r: [] for r in range(3)}
        for step in range(60):
            feeds = {r: pending[r] for r in range(3) if step < 3 or step % 3 == r}
            for r, (token, lp) in decoder.step(feeds).items():
                seqs[r].append(token)
                pending[r] = [token]
                logprobs[r].append(lp)
        assert decoder.repacks >= 1 and decoder.slots == 64
    for r in range(3):
        n = len(logprobs[r])
        fresh = prefill_logprobs(engine, unwrap_model(model), seqs[r], temperature=0.8)[-n:]
        np.testing.assert_allclose(logprobs[r], fresh, rtol=1e-5, atol=1e-6)


def test_stop_strings_and_sequences_end_turns(llama):
    tok, _ = llama
    stops = list("aeiou0123456789")
    params = SamplingParams(max_new_tokens=10, min_new_tokens=10, temperature=1.0, stop_strings=stops,
                            stop_sequences=[tok("XY", add_special_tokens=False)["input_ids"]])
    result = _run(llama, params=params, turns=3)
    early = 0
    for seg in (s for t in result.trajectories for s in t.policy_segments):
        ended = any(seg.text.endswith(s) for s in stops + ["XY"])
        assert ended or len(seg.token_ids) == 10, seg.text
        for k in range(1, len(seg.token_ids)):  # nothing before the end stopped it
            prefix = tok.decode(seg.token_ids[:k], spaces_between_special_tokens=False, clean_up_tokenization_spaces=False)
            assert not any(prefix.endswith(s) for s in stops + ["XY"]), prefix
        early += len(seg.token_ids) < 10
    assert early > 0
