"""The safety net of the compiled rollout kernels (`rollout_kernels`, ppo/rollout/ops.py and
ppo/rollout/kernel_check.py), on CPU: a wrong kernel is injected as a `CustomOps` subclass whose
op perturbs its result, writes a NaN, raises, or lets a stale cache slot past the causal end reach
its output; `auto` must run the pure-Paddle twin of exactly that op and warn once naming it, keep
every correct kernel, leave Paddle's and numpy's generators alone, and check once per process.
`custom` and `paddle` do what they say, and the argument is parsed, validated and handed to the
engine by the PPO/GRPO and online-DPO trainers."""
import json
import logging

import numpy as np
import paddle
import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.rollout import RolloutEngine, SamplingParams, fallback, kernel_check, ops
from tests.rollout_ops_helpers import custom_and_fallback_ops
from tests.test_argument_modules import ENTRY_CLASSES

PAD, EOS = 3, 2
COMPILED = ops.CustomOps  # the real kernel set (tests monkeypatch `ops.CustomOps` with broken subclasses)


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch):
    """Every test starts with no kept verdict (the compiled library built and loaded)."""
    custom_and_fallback_ops()
    monkeypatch.setattr(kernel_check, "_VERDICTS", {})


@pytest.fixture
def rollout_log(caplog):
    caplog.set_level(logging.INFO, logger="ppo.rollout")
    return caplog


def records(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == "ppo.rollout" and r.levelno == level]


# --------------------------------------------------------------------------- injected faults
def _float_result(op, out, args):
    """The float tensor a fault is written into: the op's output, or for `update` (whose output is
    a row count) its in-place log-prob table."""
    if op == "add_rms_norm":
        return out[0]
    if op == "sample":
        return out[1]
    if op == "update":
        return args[6]
    return out


def wrong_kernels(op, fault):
    """`CustomOps` with op `op` broken by `fault`: perturbed (x 1.01; update: one active row too
    many), nan (one NaN in its result), raises."""

    def wrong(self, *args):
        if fault == "raises":
            raise RuntimeError("injected fault")
        out = getattr(COMPILED, op)(self, *args)
        if op == "update" and fault == "perturbed":
            return out + 1
        target = _float_result(op, out, args)
        if fault == "nan":
            target[(0,) * len(target.shape)] = float("nan")
        else:
            paddle.assign(target * 1.01, output=target)
        return out

    return type(f"Wrong_{op}_{fault}", (COMPILED,), {op: wrong})


def _corrupt_k_cache(args):
    k_cache, layer, t0 = args[1], args[8], args[9]
    k_cache[layer, 0, 0, 0, t0] = 9.0


WRITE_FAULTS = {  # op: (what the fault writes wrong, in place; the label of the result that shows it)
    "attention": (_corrupt_k_cache, "prefill K cache"),
    "add_rms_norm": (lambda args: paddle.assign(args[1] + 0.1, output=args[1]), "cols=False residual"),
    "update": (lambda args: paddle.assign(args[7] + 1, output=args[7]), "lengths"),
}


def wrong_writes(op):
    """`CustomOps` whose op `op` returns the right result but writes a wrong value in place."""

    def wrong(self, *args):
        out = getattr(COMPILED, op)(self, *args)
        WRITE_FAULTS[op][0](args)
        return out

    return type(f"WrongWrite_{op}", (COMPILED,), {op: wrong})


class ReadsPastTheCausalEnd(COMPILED):
    """Attention whose output depends on a cache slot past the causal end (0 x NaN = NaN), the
    fault a tensor-core tile that reads unwritten slots with P = 0 has."""

    def attention(self, qkv, k_cache, v_cache, cos, sin, pos, key_mask, finished, layer, t0, *rest):
        out = super().attention(qkv, k_cache, v_cache, cos, sin, pos, key_mask, finished, layer, t0, *rest)
        tq = qkv.shape[1] if len(qkv.shape) == 3 else 1
        return out + 0.0 * v_cache[layer, :, :, t0 + tq].sum()


def test_correct_kernels_are_all_kept_and_the_verdict_logged_once(rollout_log):
    chosen = ops.get_ops("auto")
    assert type(chosen) is ops.CustomOps and chosen.name == "custom"
    assert ops.get_ops("auto").name == "custom"  # the kept verdict
    assert records(rollout_log, logging.WARNING) == []
    info = records(rollout_log, logging.INFO)
    assert len(info) == 1 and "rollout kernels checked on cpu float32" in info[0]
    assert f"compiled {', '.join(ops.ROLLOUT_OPS)}; pure Paddle none" in info[0]


@pytest.mark.parametrize("fault", ["perturbed", "nan", "raises"])
@pytest.mark.parametrize("op", ops.ROLLOUT_OPS)
def test_a_wrong_kernel_runs_its_pure_paddle_twin_with_one_warning(op, fault, rollout_log, monkeypatch):
    monkeypatch.setattr(ops, "CustomOps", wrong_kernels(op, fault))
    chosen = ops.get_ops("auto")
    assert chosen.name == "mixed" and chosen.fallback_ops == (op,)
    assert getattr(chosen, op) is getattr(fallback, op)
    for other in ops.ROLLOUT_OPS:
        if other != op:
            assert getattr(chosen, other).__func__ is getattr(COMPILED, other)
    ops.get_ops("auto")  # a second engine: the kept verdict, no new check or warning
    warnings = records(rollout_log, logging.WARNING)
    assert len(warnings) == 1 and f"the compiled {op} kernel failed its start-up check" in warnings[0]
    expected = {"perturbed": "values differ" if op == "update" else "max |error|", "nan": "NaN at",
                "raises": "raised RuntimeError: injected fault"}[fault]
    assert expected in warnings[0]
    assert f"pure Paddle {op}\n" in records(rollout_log, logging.INFO)[0] + "\n"


@pytest.mark.parametrize("op", sorted(WRITE_FAULTS))
def test_a_wrong_in_place_write_is_refused(op, rollout_log, monkeypatch):
    monkeypatch.setattr(ops, "CustomOps", wrong_writes(op))
    assert ops.get_ops("auto").fallback_ops == (op,)
    assert f"({WRITE_FAULTS[op][1]}: " in records(rollout_log, logging.WARNING)[0]


def test_attention_that_reads_a_stale_slot_past_the_causal_end_is_refused(rollout_log, monkeypatch):
    monkeypatch.setattr(ops, "CustomOps", ReadsPastTheCausalEnd)
    assert ops.get_ops("auto").fallback_ops == ("attention",)
    assert "prefill: NaN at" in records(rollout_log, logging.WARNING)[0]


def test_the_check_runs_once_per_place_and_dtype(monkeypatch):
    calls = []
    check = kernel_check._check
    monkeypatch.setattr(kernel_check, "_check", lambda *a: calls.append(a[0]) or check(*a))
    custom = ops.CustomOps()
    assert kernel_check.failed_kernels(custom, paddle.CPUPlace(), "float32") == {}
    assert kernel_check.failed_kernels(ops.CustomOps(), None, "float32") == {}  # None: the current device, the CPU
    assert calls == list(ops.ROLLOUT_OPS)
    kernel_check.failed_kernels(custom, paddle.CPUPlace(), "float16")  # another dtype is checked on its own
    assert calls == list(ops.ROLLOUT_OPS) * 2


def test_the_check_leaves_paddle_and_numpy_generators_alone():
    paddle.seed(1234)
    np.random.seed(99)
    expected_paddle, expected_numpy = paddle.rand([6]).numpy(), np.random.rand(6)
    paddle.seed(1234)
    np.random.seed(99)
    assert kernel_check.failed_kernels(wrong_kernels("sample", "perturbed")(), paddle.CPUPlace(), "float32")
    np.testing.assert_array_equal(paddle.rand([6]).numpy(), expected_paddle)
    np.testing.assert_array_equal(np.random.rand(6), expected_numpy)
    assert paddle.is_grad_enabled()


def _draw_margin(t, row, setting):
    """Relative distance (float64) of the sampled draw of batch row `row` from every boundary that
    could flip its token: the top-2 gap (greedy), the k-th/(k+1)-th gap, the top-p cut, u x mass."""
    label, step, temperature, top_k, top_p, penalty, do_sample, suppress, cols = setting
    work = t["logits"][row].astype("float64")
    if penalty != 1.0:
        seen = t["presence"][t["rows"][row]].astype(bool)
        work = np.where(seen, np.where(work > 0, work / penalty, work * penalty), work)
    work[suppress] = -np.inf
    if not do_sample:
        top = np.sort(work)[::-1]
        return (top[0] - top[1]) / max(abs(top[0]), 1.0)
    p = np.exp((work - work.max()) / temperature)
    sp = np.sort(p / p.sum())[::-1]
    k = top_k if 0 < top_k < len(sp) else len(sp)
    margins = [(sp[k - 1] - sp[k]) / sp[k - 1]] if k < len(sp) else []
    q = sp[:k] / sp[:k].sum()
    if top_p < 1.0:
        before = np.cumsum(q) - q
        margins.append(np.abs(before[1:] - top_p).min())
        q = q[(before < top_p) | (np.arange(len(q)) == 0)]
    c = np.cumsum(q)
    margins.append(np.abs(c - t["uniforms"][step, t["rows"][row]] * c[-1]).min() / c[-1])
    return min(margins)


def test_the_sampling_check_s_draws_are_far_from_every_boundary():
    """A correct kernel that sums in another order (the CUDA sampler's fixed-point masses) must draw
    the reference's tokens: every draw of the check is >= 1e-4 (relative) from a boundary, far
    beyond float32 rounding of a 5,003-entry sum (~1e-6)."""
    t, settings = kernel_check.sample_inputs(kernel_check._Inputs(None, "float32", 0))
    live = [b for b in range(len(t["rows"])) if not t["finished"][b]]
    margins = {s[0]: min(_draw_margin(t, b, s) for b in live) for s in settings}
    assert min(margins.values()) >= 1e-4, margins


# --------------------------------------------------------------------------- modes and the engine
def test_custom_and_paddle_modes_run_no_check(rollout_log, monkeypatch):
    monkeypatch.setattr(ops, "CustomOps", wrong_kernels("attention", "nan"))
    assert type(ops.get_ops("custom")) is ops.CustomOps  # unchecked: the (wrong) compiled kernel
    assert type(ops.get_ops("paddle")) is ops.FallbackOps
    assert kernel_check._VERDICTS == {} and records(rollout_log, logging.WARNING) == []
    with pytest.raises(ValueError, match=r"rollout_kernels must be one of \('auto', 'custom', 'paddle'\), got 'cuda'"):
        ops.get_ops("cuda")


def test_without_the_library_custom_is_an_error_and_auto_falls_back(monkeypatch):
    monkeypatch.setattr(ops, "notice_fallback", lambda: False)
    monkeypatch.setattr(ops, "unavailable_reason", lambda: "the library was removed")
    with pytest.raises(RuntimeError, match=r"rollout_kernels custom: .*\(the library was removed\)"):
        ops.get_ops("custom")
    assert ops.get_ops("auto").name == "paddle" and kernel_check._VERDICTS == {}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from ppo.tiny.factory import build_tiny

    tok, model = build_tiny(str(tmp_path_factory.mktemp("llama")), seed=7, hidden_size=64, num_layers=2, num_heads=4,
                            intermediate_size=128)
    model.eval()
    ids = [tok(f"USER: Reverse: {t} ASSISTANT:")["input_ids"] for t in ("k3x9q", "ab", "Hello!")]
    width = max(len(r) for r in ids)
    rows = np.array([[PAD] * (width - len(r)) + r for r in ids], "int64")
    return model, paddle.to_tensor(rows), paddle.to_tensor((rows != PAD).astype("int64"))


def test_engine_with_a_wrong_attention_kernel_generates_what_pure_paddle_generates(tiny_llama, monkeypatch):
    model, ids, mask = tiny_llama
    params = SamplingParams(max_new_tokens=8, min_new_tokens=0, do_sample=False)
    reference = RolloutEngine(model, EOS, PAD, kernels="paddle").generate(ids, mask, params)
    monkeypatch.setattr(ops, "CustomOps", wrong_kernels("attention", "perturbed"))
    engine = RolloutEngine(model, EOS, PAD)  # auto
    assert engine.backend == "mixed" and engine.ops.fallback_ops == ("attention",)
    out = engine.generate(ids, mask, params)
    assert out.stats["backend"] == "mixed"
    np.testing.assert_array_equal(out.response_ids.numpy(), reference.response_ids.numpy())
    np.testing.assert_allclose(out.response_logprobs.numpy(), reference.response_logprobs.numpy(), atol=1e-5)
    unchecked = RolloutEngine(model, EOS, PAD, kernels="custom")
    assert type(unchecked.ops) is ops.CustomOps and unchecked.backend == "custom"


def test_engine_modes(tiny_llama):
    model = tiny_llama[0]
    assert RolloutEngine(model, EOS, PAD, kernels="paddle").backend == "paddle"
    assert kernel_check._VERDICTS == {}
    assert RolloutEngine(model, EOS, PAD).backend == "custom"
    assert list(kernel_check._VERDICTS) == [(ops.CustomOps, "cpu", "float32")]


# --------------------------------------------------------------------------- the argument
@pytest.mark.parametrize("entry", ["ppo", "online_dpo"])
def test_rollout_kernels_is_parsed_from_json_and_validated(entry, tmp_path):
    out = ["--output_dir", str(tmp_path / "out"), "--max_steps", "2"]
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"rollout_kernels": "paddle"}))
    assert parse_arguments(ENTRY_CLASSES[entry], [str(path), *out])[2].rollout_kernels == "paddle"
    assert parse_arguments(ENTRY_CLASSES[entry], out)[2].rollout_kernels == "auto"
    path.write_text(json.dumps({"rollout_kernels": "cuda"}))
    with pytest.raises(ArgumentError, match=r"rollout_kernels must be one of \('auto', 'custom', 'paddle'\), got 'cuda'"):
        parse_arguments(ENTRY_CLASSES[entry], [str(path), *out])
    with pytest.raises(ArgumentError, match="rollout_kernels custom picks the rollout engine's kernels, and use_fusemt false"):
        parse_arguments(ENTRY_CLASSES[entry], [*out, "--rollout_kernels", "custom", "--use_fusemt", "false"])


def test_the_trainers_hand_rollout_kernels_to_their_engine(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    from dpo.run_online_dpo import build_trainer as build_online_dpo
    from ppo.run_ppo import build_trainer as build_ppo
    from tests.test_online_dpo import online_argv
    from tests.test_ppo_trainer import ppo_argv

    ppo = build_ppo(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, str(tmp_path / "ppo"), "--max_steps", "1",
                             "--rollout_kernels", "paddle"))
    online = build_online_dpo(online_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "online"), "--rollout_kernels",
                                          "paddle"))
    assert ppo.experience.rollout.engine.backend == "paddle" and online.experience.rollout.engine.backend == "paddle"
