"""Every training stage on every model family of our own Paddle classes (Qwen3, Qwen3-MoE,
ERNIE 4.5, ERNIE 4.5 MoE, Qwen2-MoE, Mixtral; the tiny models of `ppo.tiny.factory`), 2 steps each
through the real entry points: LoRA SFT, the reward model, PPO with the family's reward model and
critic, GRPO scored by the reward server, GRPO with a LoRA policy, the DPO family, online DPO,
distillation between two families that share a tokenizer, and the agent rollout (GRPO over a
multi-turn environment); and, by value, the router's aux loss joining the reward model's and the
PPO critic's losses.

Each cell asserts one finite record per step with the stage's own metrics (and the router's on
an MoE family), and that the saved weights reload as the family's class with the base model's
keys and shapes and the trained model's logits (scores for a score model). Full SFT and GRPO with
rule scorers on every family are in tests/test_qwen3_training.py, test_ernie45_training.py and
test_qwen3_moe_training.py; PPO on Qwen3 and ERNIE 4.5 there too. The default suite runs one
family per stage (rotating); the whole matrix is marked slow (docs/quickstart_families.md has the
table)."""
import os
import re

import numpy as np
import pytest

from tests import family_stages as fs
from tests.test_qwen3_moe_training import tiny_moe as tiny_family

DEFAULT = {"sft_lora": "qwen3", "rm": "ernie45_moe", "ppo": "qwen2_moe", "grpo_server": "mixtral", "dpo": "qwen3_moe",
           "online_dpo": "ernie45", "distill": "mixtral", "agent": "qwen3_moe", "lora_grpo": "ernie45_moe"}
"""The cell of each stage in the default suite; the other families' cells are slow."""


def cells(stage, families=fs.FAMILIES):
    return [pytest.param(arch, marks=() if DEFAULT[stage] == arch else pytest.mark.slow, id=arch) for arch in families]


ATTENTION = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}
DENSE = {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
EXPERTS = {"mlp.experts.N.gate_proj", "mlp.experts.N.up_proj", "mlp.experts.N.down_proj"}
LORA_TARGETS = {  # the default `lora_target_modules`: attention, dense MLPs, routed and shared experts; never a router
    "qwen3": ATTENTION | DENSE, "ernie45": ATTENTION | DENSE,
    "qwen3_moe": ATTENTION | DENSE | EXPERTS,  # the tiny model's layer 0 is dense (`mlp_only_layers`)
    "ernie45_moe": ATTENTION | DENSE | EXPERTS | {"mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj",
                                                  "mlp.shared_experts.down_proj"},
    "qwen2_moe": ATTENTION | DENSE | EXPERTS | {"mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                                                "mlp.shared_expert.down_proj"},
    "mixtral": ATTENTION | EXPERTS,  # every layer sparse
}


def adapted_modules(model):
    """The modules holding a LoRA adapter, named inside a decoder layer (expert numbers as N)."""
    names = {n.split(".layers.", 1)[1].split(".lora_A")[0] for n, _ in model.named_parameters() if ".lora_A" in n}
    return {re.sub(r"^\d+\.", "", re.sub(r"\.\d+\.", ".N.", n)) for n in names}


@pytest.mark.parametrize("arch", cells("sft_lora"))
def test_lora_sft(arch, tmp_path, tmp_path_factory, tiny_data_dir, monkeypatch):
    """2 LoRA SFT steps: the default targets of the family (router and Qwen2-MoE's shared-expert
    gate not among them), only the adapters move, the adapter reloads with the trained logits."""
    from ppo.models.loading import load_causal_lm
    from tests.hf_weights_helpers import causal_logits

    model_dir, out = tiny_family(tmp_path_factory, arch), str(tmp_path / "lora")
    records, model = fs.sft_lora(model_dir, tiny_data_dir, out, monkeypatch)
    fs.assert_router_stats(arch, records)
    assert adapted_modules(model) == LORA_TARGETS[arch]
    routers = [p for n, p in model.named_parameters() if n.endswith(("mlp.gate.weight", "mlp.shared_expert_gate.weight"))]
    assert len(routers) == {"qwen3": 0, "ernie45": 0, "qwen3_moe": 1, "ernie45_moe": 1, "qwen2_moe": 2, "mixtral": 2}[arch]
    assert all(p.stop_gradient for p in routers)  # frozen with the base weights
    base = load_causal_lm(model_dir).state_dict()
    moved = []
    for name, value in model.state_dict().items():
        if "lora_" in name:
            moved.append("lora_B" in name and float(value.abs().sum()) > 0)
        else:
            np.testing.assert_array_equal(value.numpy(), base[name.split(".", 1)[1]].numpy(), err_msg=name)
    assert any(moved)
    assert os.path.isfile(f"{out}/lora_config.json") and os.path.isfile(f"{out}/lora_model_state.pdparams")
    saved = load_causal_lm(out)
    assert type(saved.model).__name__ == fs.CAUSAL[arch] and adapted_modules(saved) == LORA_TARGETS[arch]
    np.testing.assert_array_equal(causal_logits(saved, fs.IDS), causal_logits(model, fs.IDS))
    assert np.abs(causal_logits(saved, fs.IDS) - causal_logits(load_causal_lm(model_dir), fs.IDS)).max() > 0


@pytest.mark.parametrize("arch", cells("lora_grpo"))
def test_lora_grpo_engine_applies_the_adapters(arch, tmp_path, tmp_path_factory, tiny_data_dir):
    """2 GRPO steps of a LoRA policy: the rollout engine's log-probs equal the training forward's
    (1e-4, the llama path's tolerance) at step 2 too, after the adapters on attention and experts
    moved; the saved adapter reloads with the trained logits."""
    model_dir, out = tiny_family(tmp_path_factory, arch), str(tmp_path / "lora_grpo")
    records, trainer = fs.lora_grpo(model_dir, tiny_data_dir, out)
    fs.assert_finite(records, "loss/policy_avg", "rollout/logprob_diff_mean", "rollout/logprob_diff_max")
    assert all(r["rollout/logprob_diff_max"] < 1e-4 for r in records), records
    fs.assert_router_stats(arch, records)
    actor = trainer.passes.models.actor
    assert adapted_modules(actor) == LORA_TARGETS[arch]
    fs.assert_causal_reload(os.path.join(out, "policy"), actor, model_dir, arch, adapter=True)


@pytest.mark.parametrize("arch", cells("rm"))
def test_reward_model(arch, tmp_path, tmp_path_factory, tiny_data_dir, monkeypatch):
    model_dir, out = tiny_family(tmp_path_factory, arch), str(tmp_path / "rm")
    records, model = fs.reward_model(model_dir, tiny_data_dir, out, monkeypatch)
    final = fs.summary(out)["final_eval"]  # the held-out pairs after the 2 steps
    assert 0.0 <= final["rm/accuracy"] <= 1.0 and np.isfinite(final["rm/margin"]) and final["rm/margin"] != 0
    fs.assert_router_stats(arch, records)
    fs.assert_score_reload(out, model, model_dir, arch)


def family_rm_dir(tmp_path_factory, arch):
    from tests.conftest import save_score_model

    return save_score_model(tiny_family(tmp_path_factory, arch), str(tmp_path_factory.mktemp(f"rm_{arch}")))


@pytest.mark.parametrize("arch", cells("ppo", sorted(fs.MOE)))
def test_ppo_with_the_family_reward_model_and_critic(arch, tmp_path, tmp_path_factory, tiny_data_dir):
    model_dir, out = tiny_family(tmp_path_factory, arch), str(tmp_path / "ppo")
    records, trainer = fs.ppo(model_dir, family_rm_dir(tmp_path_factory, arch), tiny_data_dir, out)
    fs.assert_finite(records, "objective/kl", "objective/rlhf_reward", "loss/policy_avg", "loss/value_avg",
                     "policy/approxkl_avg", "response_length/mean")
    assert records[0]["objective/kl"] == pytest.approx(0.0, abs=1e-5)  # step 1 samples from the reference's weights
    fs.assert_router_stats(arch, records)
    critic_keys = [key.replace("moe/", "moe/reward_critic_") for key in fs.MOE_KEYS]
    fs.assert_finite(records, *critic_keys)  # the critic's router loss joins its value loss
    assert all(r["moe/reward_critic_aux_loss"] > 0 and r["moe/reward_critic_dropped_tokens"] == 0.0 for r in records)
    models = trainer.passes.models
    fs.assert_causal_reload(os.path.join(out, "policy"), models.actor, model_dir, arch)
    fs.assert_score_reload(os.path.join(out, "value"), models.critic, model_dir, arch, score_type="critic")


@pytest.fixture(scope="module")
def graded_server():
    """The reward server with partial credit on the reversal (advantages are not all 0)."""
    from tests.test_reward_server import ServerProcess

    server = ServerProcess("--scorer", "tests.rule_reward_helpers:_char_recall_scorer", "--threads", "2")
    yield server
    server.cleanup()


@pytest.mark.parametrize("arch", cells("grpo_server"))
def test_grpo_with_the_reward_server(arch, tmp_path, tmp_path_factory, tiny_data_dir, graded_server):
    model_dir, out = tiny_family(tmp_path_factory, arch), str(tmp_path / "grpo")
    records, trainer = fs.grpo_server(model_dir, tiny_data_dir, out, graded_server.url)
    fs.assert_finite(records, "loss/policy_avg", "loss/kl", "grpo/frac_reward_zero_std", "response_length/mean")
    assert records[0]["objective/scores"] > 0 and trainer.passes.models.critic is None
    assert all(0.0 <= r["grpo/frac_reward_zero_std"] < 1.0 for r in records)
    fs.assert_router_stats(arch, records)
    fs.assert_causal_reload(os.path.join(out, "policy"), trainer.passes.models.actor, model_dir, arch)


DPO_LOSSES = {"qwen3": "ipo", "qwen3_moe": "simpo", "ernie45": "kto_pair", "ernie45_moe": "orpo", "qwen2_moe": "hinge",
              "mixtral": "kto"}
"""Besides sigmoid DPO on every family, one more loss of the family per model family."""


def dpo_cells():
    out = []
    for arch in fs.FAMILIES:
        for loss in ("sigmoid", DPO_LOSSES[arch]):
            slow = not (DEFAULT["dpo"] == arch and loss == "sigmoid")
            out.append(pytest.param(arch, loss, marks=pytest.mark.slow if slow else (), id=f"{arch}-{loss}"))
    return out


@pytest.mark.parametrize("arch, loss_type", dpo_cells())
def test_dpo_family(arch, loss_type, tmp_path, tmp_path_factory, tiny_data_dir, monkeypatch):
    """Reference losses start at margin 0 (the policy is the reference) and move off it at step 2."""
    model_dir, out = tiny_family(tmp_path_factory, arch), str(tmp_path / "dpo")
    records, trainer = fs.dpo(model_dir, tiny_data_dir, out, monkeypatch, loss_type)
    fs.assert_finite(records, "loss/dpo", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                     *(("kto/kl",) if loss_type == "kto" else ()), *(("orpo/nll_loss",) if loss_type == "orpo" else ()))
    if trainer.ref_model is not None:
        assert records[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
        assert abs(records[1]["rewards/margins"]) > 1e-6
    else:
        assert loss_type in ("simpo", "orpo")
    fs.assert_router_stats(arch, records)
    if loss_type == "sigmoid":  # total = DPO + chosen NLL (sft_loss_ratio 1) + the router's weighted aux loss
        coef = trainer.model.config.router_aux_loss_coef if arch in fs.MOE else 0.0
        for r in records:
            aux = coef * r["moe/aux_loss"] if coef else 0.0
            assert r["loss/total"] == pytest.approx(r["loss/dpo"] + r["loss/sft"] + aux, abs=2e-6), r
    fs.assert_causal_reload(out, trainer.model, model_dir, arch)


@pytest.mark.parametrize("arch", cells("online_dpo"))
def test_online_dpo(arch, tmp_path, tmp_path_factory, tiny_data_dir):
    model_dir, out = tiny_family(tmp_path_factory, arch), str(tmp_path / "online")
    records, trainer = fs.online_dpo(model_dir, tiny_data_dir, out)
    fs.assert_finite(records, "rewards/margins", "loss/total", "objective/scores")
    assert all(r["online_dpo/num_pairs"] >= 1 and r["online_dpo/score_gap"] > 0 for r in records)
    assert records[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # round 1 starts at the reference
    assert abs(records[1]["rewards/margins"]) > 1e-6
    fs.assert_router_stats(arch, records)
    fs.assert_causal_reload(os.path.join(out, "policy"), trainer.passes.models.actor, model_dir, arch)


TEACHERS = {"qwen3": "qwen3_moe", "qwen3_moe": "qwen3", "ernie45": "ernie45_moe", "ernie45_moe": "ernie45",
            "qwen2_moe": "mixtral", "mixtral": "qwen2_moe"}
"""The teacher of each student: another family with the same tokenizer (the tiny Qwen3 and
Qwen3-MoE share theirs, ERNIE 4.5 dense and MoE theirs, Qwen2-MoE and Mixtral Llama's)."""


@pytest.mark.parametrize("arch", cells("distill"))
def test_distill_from_a_teacher_of_another_family(arch, tmp_path, tmp_path_factory, tiny_data_dir, monkeypatch):
    model_dir = tiny_family(tmp_path_factory, arch)
    teacher_dir, out = tiny_family(tmp_path_factory, TEACHERS[arch]), str(tmp_path / "distill")
    records, model = fs.distill(model_dir, teacher_dir, tiny_data_dir, out, monkeypatch)
    fs.assert_finite(records, "distill/jsd", "distill/teacher_logprob", "distill/on_policy_frac")
    assert all(r["distill/jsd"] > 0 for r in records)
    fs.assert_router_stats(arch, records)
    coef = model.config.router_aux_loss_coef if arch in fs.MOE else 0.0
    for r in records:  # the step's token-mean JSD plus an MoE student's weighted router loss
        assert r["loss/distill"] == pytest.approx(r["distill/jsd"] + coef * r.get("moe/aux_loss", 0.0), abs=2e-6), r
    fs.assert_causal_reload(out, model, model_dir, arch)


def test_distill_between_families_with_different_tokenizers_is_refused_by_key(tmp_path_factory, tiny_data_dir, tmp_path,
                                                                             monkeypatch, capsys):
    """A Qwen3 student and an ERNIE 4.5 teacher: one line naming `teacher_model_name_or_path`,
    exit code 2, before any model loads (not also the vocab_size and embedding rows it implies)."""
    import sft.run_distill as run_distill
    from ppo.common.process_exit import run_and_exit
    from tests.test_distill import distill_argv

    student, teacher = tiny_family(tmp_path_factory, "qwen3"), tiny_family(tmp_path_factory, "ernie45")

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the tokenizers were compared")

    monkeypatch.setattr(run_distill, "load_causal_lm", no_model)
    argv = distill_argv(student, teacher, tiny_data_dir, str(tmp_path / "out"))
    with pytest.raises(SystemExit) as info:
        run_and_exit(lambda: run_distill.main(argv))
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert ": error: teacher_model_name_or_path: different tokenizers: " in line, line
    assert student in line and teacher in line and "'<|im_start|>'" in line and "vocab_size" not in line


@pytest.mark.parametrize("arch", cells("agent"))
def test_agent_rollout(arch, tmp_path, tmp_path_factory, tiny_data_dir):
    """GRPO over the echo environment's multi-turn trajectories: the policy's own tokens train."""
    model_dir, out = tiny_family(tmp_path_factory, arch), str(tmp_path / "agent")
    records, trainer = fs.agent_grpo(model_dir, tiny_data_dir, out)
    fs.assert_finite(records, "loss/policy_avg", "response_length/mean")
    assert records[0]["objective/scores"] > 0
    fs.assert_router_stats(arch, records)
    fs.assert_causal_reload(os.path.join(out, "policy"), trainer.passes.models.actor, model_dir, arch)


def test_the_router_loss_joins_the_reward_model_loss(tmp_path_factory):
    """In training, `RewardTrainer.compute_loss` on an MoE score model is the pair loss plus
    `router_aux_loss_coef` x the load-balancing loss of the same forward (logged as
    `moe/aux_loss`); in eval mode the score model computes no router loss."""
    import types

    import paddle

    from ppo.models.score_model import AutoModelForScore
    from rm.reward_trainer import RewardTrainer, reward_loss

    model = AutoModelForScore.from_pretrained(tiny_family(tmp_path_factory, "qwen3_moe"))
    model.config.router_aux_loss_coef = 10.0
    ids = paddle.to_tensor([[1, 4, 7, 30, 31, 2], [1, 9, 12, 5, 2, 2]])
    inputs = {"better_input_ids": ids, "worse_input_ids": ids.flip([1]), "better_attention_mask": paddle.ones_like(ids),
              "worse_attention_mask": paddle.ones_like(ids)}
    trainer = RewardTrainer.__new__(RewardTrainer)
    trainer.args, trainer.packed_length = types.SimpleNamespace(loss_type="sequence-wise", regularization=0.0), None
    model.train()
    total = float(trainer.compute_loss(model, inputs))
    aux = trainer.moe_stats.take()["moe/aux_loss"]
    pair = float(reward_loss(model, inputs, "sequence-wise", 0.0)[0])
    assert aux > 0 and total == pytest.approx(pair + 10.0 * aux, rel=1e-5)
    model.eval()
    assert float(trainer.compute_loss(model, inputs)) == pytest.approx(pair, rel=1e-6) and not trainer.moe_stats.take()


def test_the_router_loss_joins_the_critic_value_loss(tmp_path_factory):
    """`PlainPasses.value_backward` backpropagates an MoE critic's value loss plus its router loss
    split over the step's micro-batches: the router's gradient is the value loss's plus that of
    aux / n_micro, and the stats name the critic (`moe/reward_critic_aux_loss`)."""
    import paddle

    from ppo.models.families.moe import take_aux_loss
    from ppo.models.score_model import AutoModelForScore
    from ppo.passes.plain import PlainPasses

    model = AutoModelForScore.from_pretrained(tiny_family(tmp_path_factory, "qwen3_moe"), score_type="critic")
    model.config.router_aux_loss_coef = 10.0
    model.train()
    router = model.qwen3_moe.layers[1].mlp.gate.weight
    ids = paddle.to_tensor([[1, 4, 7, 30, 31, 2, 9]])

    def router_grad(with_router, aux_only=False):
        model.clear_gradients()
        values = model(ids).scores
        taken = take_aux_loss(model)
        if aux_only:
            (taken[0] / 2).backward()
            return router.grad.numpy().copy(), {}
        totals = {"reward": 0.0}
        stats = PlainPasses.value_backward(lambda mb, forward: (forward["values"].square().sum(), {}), None, values, totals,
                                           "reward", taken if with_router else (None, {}), 2)
        return router.grad.numpy().copy(), stats

    value_only, no_stats = router_grad(False)
    both, stats = router_grad(True)
    aux_only, _ = router_grad(True, aux_only=True)
    assert not no_stats and stats["moe/reward_critic_aux_loss"] > 0 and "moe/aux_loss" not in stats
    np.testing.assert_allclose(both, value_only + aux_only, rtol=1e-5, atol=1e-7)
    assert np.abs(aux_only).max() > 1e-6
