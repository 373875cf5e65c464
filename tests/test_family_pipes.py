"""Our families' pipeline classes (`ppo/strategy/pipeline/family_pipes.py`) at pp_degree=1 equal the
plain models from the same checkpoint, bit for bit: logits (score-model pipe: scores) on a padded
batch and every parameter's gradient, tied and untied heads, and with full recompute. The cases run in one process of
tests/family_pipe_pp1_worker.py (`fleet.init` is process-global). Also: which model types have a
pipeline class; an MoE score-model pipe carrying router sums is refused by name."""
import json
from types import SimpleNamespace

import pytest

from ppo.strategy.pipeline.pipe import pipe_classes, pipe_model_types
from tests.case_worker import run_case_worker

CASES = ("qwen3", "qwen3:untied", "ernie45", "ernie45:untied", "qwen3:score", "ernie45:score", "ernie45:recompute",
         "qwen3_moe", "ernie45_moe", "qwen2_moe", "mixtral:recompute", "qwen3_moe:score",
         "qwen3_moe:score_no_router_loss")
NAMES = {"qwen3": "Qwen3", "ernie45": "Ernie4_5", "qwen3_moe": "Qwen3Moe", "ernie45_moe": "Ernie4_5_Moe",
         "qwen2_moe": "Qwen2Moe", "mixtral": "Mixtral"}
TIED = ("qwen3", "ernie45", "qwen3_moe", "ernie45_moe")  # as the tiny factory builds them


@pytest.fixture(scope="module")
def pp1_results(tmp_path_factory):
    proc, results = run_case_worker("family_pipe_pp1_worker.py", tmp_path_factory.mktemp("family_pp1"), CASES)
    assert proc.returncode == 0 and set(results) == set(CASES), proc.stdout[-2000:] + proc.stderr[-3000:]
    return results


@pytest.mark.parametrize("case", [c for c in CASES if c != "qwen3_moe:score"])
def test_family_pipe_pp1_equals_plain_model(pp1_results, case):
    """Mixture of experts: the router losses from the sums the layers carry equal the plain
    model's `moe_aux_loss` (summation order: within 5e-10), and enter the gradients (x100)."""
    kind, text = pp1_results[case]
    assert kind == "RESULT", text
    res = json.loads(text)
    arch, _, variant = case.partition(":")
    name = NAMES[arch]
    score = variant.startswith("score")
    assert res["pipe_class"] == (f"{name}ModelForScorePipe" if score else f"{name}ForCausalLMPipe")
    assert res["shape"][:2] == [2, 12] and (score or res["shape"][2] >= 100)
    assert res["out_diff"] == 0.0 and res["grad_diff"] == 0.0
    assert res["n_grads"] > 10 and res["grad_max"] > 0
    plain_aux, pipe_aux = res["router_losses"]
    if (arch.endswith("moe") or arch == "mixtral") and not score:
        assert plain_aux > 1e-3 and abs(pipe_aux - plain_aux) <= 1e-6 * plain_aux
    else:  # a score model without output_router_logits computes none
        assert plain_aux is None and pipe_aux is None
    # one stage holds the embedding and the tied head: one parameter, as in the plain model
    tied_lm = arch in TIED and not score and variant != "untied"
    assert res["missing_keys"] == (["lm_head.weight"] if tied_lm else []) and res["extra_keys"] == []
    assert res["recomputed_layers"] == (2 if variant == "recompute" else 0)  # each decoder layer once


def test_moe_score_pipe_carrying_router_sums_refused(pp1_results):
    kind, text = pp1_results["qwen3_moe:score"]
    assert kind == "FAILED" and "a score model (reward model, critic) on model_type 'qwen3_moe'" in text
    assert "output_router_logits true is not implemented" in text


def test_pipeline_model_types():
    from ppo.models.families.qwen3_modeling import Qwen3Config

    assert pipe_model_types() == ["ernie4_5", "ernie4_5_moe", "llama", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"]
    assert pipe_classes(Qwen3Config(tie_word_embeddings=True))[1] == "Qwen3ForCausalLM"
    with pytest.raises(ValueError, match=r"no pipeline class for model_type 'gpt'; supported: \['ernie4_5', 'ernie4_5_moe'"):
        pipe_classes(SimpleNamespace(model_type="gpt"))


def test_router_sums_give_the_one_process_router_losses():
    """Two layers' router sums per row, of the real rows only, give `moe_losses` of the layers'
    logits pooled with the padding mask (float32 summation order: 1e-6 relative), z-loss on."""
    import numpy as np
    import paddle

    from ppo.models.families.moe import moe_losses
    from ppo.models.families.qwen2_moe_modeling import Qwen2MoeConfig
    from ppo.strategy.pipeline.family_moe_pipe import router_losses_from_sums, router_row_sums

    config = Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01, router_z_loss_coef=0.1)
    rng = np.random.default_rng(0)
    mask = np.ones([3, 5], "float32")
    mask[1, 3:] = 0
    layers = [paddle.to_tensor(rng.normal(size=[15, 4]).astype("float32")) for _ in range(2)]
    expected, stats = moe_losses(layers, config, paddle.to_tensor(mask))
    rows = paddle.to_tensor(mask)
    sums = router_row_sums(layers[0], rows, config) + router_row_sums(layers[1], rows, config)
    assert sums.shape == [3, 10] and float(sums[1, 8]) == 2 * 3  # two layers x three real tokens
    loss, got = router_losses_from_sums(sums.sum(axis=0), config)
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
    for key in stats:
        np.testing.assert_allclose(float(got[key]), float(stats[key]), rtol=1e-6, err_msg=key)


def test_rl_update_counts_the_router_loss_of_real_micro_batches_only():
    """`RouterLossCriterion` around the RL update's criterion: a micro-batch's first real rows
    only, weighted by micro-batches / real ones (the schedule's mean undone: each real one's
    router loss over their count, as the plain update); a stand-in or ptx micro-batch adds
    nothing and records no `moe/*` stats."""
    import paddle

    from ppo.models.families.qwen2_moe_modeling import Qwen2MoeConfig
    from ppo.strategy.pipeline.family_moe_pipe import RouterLossCriterion, router_losses_from_sums
    from ppo.strategy.pipeline.policy_pipe import ExperienceCriterion

    config = Qwen2MoeConfig(num_experts=2, num_experts_per_tok=1, router_aux_loss_coef=1.0)
    recorded = []
    inner = ExperienceCriterion(accumulate_steps=2, record=recorded.append, view=lambda p, fields: fields)
    criterion = RouterLossCriterion(inner, config)
    inner.prepare(0, ["x"], lambda mb, out: (out.sum(), {"x": out.sum()}), tail=[(["x"], lambda mb, out: (out.sum(), {}))],
                  real_rows=[1, 0])
    sums = paddle.to_tensor([[3.0, 1.0, 2.5, 1.5, 4.0, 0.0], [9.0, 9.0, 9.0, 9.0, 9.0, 0.0]])
    logits = paddle.ones([2, 1])
    first = criterion((logits, sums), [paddle.zeros([1])])
    aux = float(router_losses_from_sums(sums[:1].sum(axis=0), config)[0])
    assert abs(float(first) - (3 * 2.0 + 3 * aux)) < 1e-5  # (2 + aux) x 3 kinds / 1 real micro-batch
    assert float(criterion((logits, sums), [paddle.zeros([1])])) == 3 * 2.0  # stand-in
    assert float(criterion((logits, sums), [paddle.zeros([1])])) == 3 * 2.0  # ptx
    assert "moe/aux_loss" in recorded[0] and "moe/aux_loss" not in recorded[1] and "moe/aux_loss" not in recorded[2]
