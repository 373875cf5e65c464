"""The tiny Qwen3-MoE, Qwen2-MoE, Mixtral and ERNIE 4.5 MoE (`ppo.tiny.factory --arch qwen3_moe |
qwen2_moe | mixtral | ernie45_moe`) through the entry points: 2 SFT steps from its Hugging Face
export, then 2 GRPO steps with the rule scorer (the rollout engine generating, routed experts in
it), each logging finite losses and the router stats (`moe/aux_loss`,
`moe/expert_load_max_over_mean`, `moe/dropped_tokens` 0), and saving a model that reloads as our
causal LM class with the trained weights. The router's load-balancing
loss joins the training loss: with it the router's gradient differs from the NLL's alone."""
import json
import os

import numpy as np
import paddle
import pytest

from tests.hf_weights_helpers import causal_logits

IDS = [[1, 4, 7, 30, 31, 2, 9]]
MOE_KEYS = ("moe/aux_loss", "moe/expert_load_max_over_mean", "moe/dropped_tokens")


CLASS = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "mixtral": "MixtralForCausalLM",
         "ernie45_moe": "Ernie4_5_MoeForCausalLM"}
ROUTING = {  # the tiny config's routing fields: 4 experts, top-2, the first layer dense
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [0], "moe_intermediate_size": 64},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [0], "moe_intermediate_size": 64,
                  "shared_expert_intermediate_size": 128, "qkv_bias": True},
    "mixtral": {"num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 128, "tie_word_embeddings": False},
    "ernie45_moe": {"moe_num_experts": 4, "moe_k": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 1,
                    "moe_num_shared_experts": 1, "moe_intermediate_size": 64},
}
_built = {}


def tiny_moe(tmp_path_factory, arch):
    """The tiny MoE model of `arch`, built once per session."""
    from ppo.tiny.factory import build_tiny

    if arch not in _built:
        _built[arch] = str(tmp_path_factory.mktemp(f"tiny_{arch}"))
        build_tiny(_built[arch], seed=5, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, arch=arch)
    return _built[arch]


@pytest.fixture(scope="module")
def tiny_moe_dir(tmp_path_factory):
    return tiny_moe(tmp_path_factory, "qwen3_moe")


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "mixtral", "ernie45_moe"])
def test_the_factory_builds_a_tiny_moe(tmp_path_factory, arch):
    config = json.load(open(os.path.join(tiny_moe(tmp_path_factory, arch), "config.json")))
    assert config["architectures"] == [CLASS[arch]] and config["output_router_logits"] is True
    assert {key: config[key] for key in ROUTING[arch]} == ROUTING[arch]


def _moe_stats(line):
    for key in MOE_KEYS:
        assert key in line and np.isfinite(line[key]), (key, line)
    assert line["moe/dropped_tokens"] == 0.0 and line["moe/expert_load_max_over_mean"] >= 1.0
    assert line["moe/aux_loss"] > 0


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "mixtral", "ernie45_moe"])
def test_sft_then_grpo_train_log_router_stats_and_reload(tmp_path, tmp_path_factory, tiny_data_dir, arch):
    from ppo.models.hf_convert import export_dir
    from ppo.models.loading import load_causal_lm
    from ppo.run_ppo import build_trainer
    from sft.run_sft import main as run_sft
    from tests.test_ppo_trainer import read_metrics

    tiny_moe_dir = tiny_moe(tmp_path_factory, arch)
    hf_dir = str(tmp_path / "hf")
    export_dir(tiny_moe_dir, hf_dir)
    sft_out = str(tmp_path / "sft")
    run_sft(["config/tiny/sft_argument.json", "--model_name_or_path", hf_dir,
             "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl",
             "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--output_dir", sft_out,
             "--logging_dir", f"{sft_out}/vdl", "--max_steps", "2", "--logging_steps", "1",
             "--per_device_train_batch_size", "8", "--evaluation_strategy", "no", "--do_eval", "false",
             "--save_steps", "0", "--disable_tqdm", "true"])
    lines = [r for r in read_metrics(sft_out) if "loss/sft" in r]
    assert len(lines) == 2 and all(np.isfinite(r["loss/sft"]) for r in lines), lines
    for line in lines:
        _moe_stats(line)
    base, sft = load_causal_lm(tiny_moe_dir), load_causal_lm(sft_out)
    np.testing.assert_array_equal(causal_logits(load_causal_lm(hf_dir), IDS), causal_logits(base, IDS))
    assert type(sft).__name__ == CLASS[arch]
    assert np.abs(causal_logits(sft, IDS) - causal_logits(base, IDS)).max() > 0

    out = str(tmp_path / "grpo")
    trainer = build_trainer([
        "config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", sft_out,
        "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", "2", "--per_device_prompt_batch_size", "4", "--rollout_n", "4", "--per_device_train_batch_size", "16",
        "--max_dec_len", "6", "--evaluation_strategy", "no", "--save_steps", "0", "--num_sample_generations", "1",
        "--learning_rate", "1e-3", "--disable_tqdm", "true",
        "--rule_reward_scorers", "tests.rule_reward_helpers:_char_recall_scorer"])
    trainer.train()
    lines = [r for r in read_metrics(out) if "objective/scores" in r]
    assert len(lines) == 2
    for line in lines:
        for key in ("objective/scores", "loss/policy_avg", "response_length/mean"):
            assert np.isfinite(line[key]), (key, line)
        _moe_stats(line)
    policy = load_causal_lm(os.path.join(out, "policy"))
    assert type(policy).__name__ == CLASS[arch]
    np.testing.assert_array_equal(causal_logits(policy, IDS), causal_logits(trainer.passes.models.actor, IDS))
    assert np.abs(causal_logits(policy, IDS) - causal_logits(sft, IDS)).max() > 0


def test_the_aux_loss_joins_the_sft_loss(tiny_moe_dir):
    """`SFTTrainer.add_moe_aux_loss` adds the forward's weighted router loss: the router gradient
    with it differs from the NLL's alone by the aux loss's own gradient."""
    from ppo.models.causal_lm import answer_nll
    from ppo.models.loading import load_causal_lm
    from sft.sft_trainer import SFTTrainer

    grads = []
    for with_aux in (False, True):
        model = load_causal_lm(tiny_moe_dir)
        model.config.router_aux_loss_coef = 10.0
        model.train()
        ids = paddle.to_tensor([[1, 4, 7, 30, 31, 2, 9, 12]])
        mask = paddle.ones_like(ids)
        loss, _ = answer_nll(model, ids, mask, ids, 0)
        if with_aux:
            trainer = SFTTrainer.__new__(SFTTrainer)
            loss = trainer.add_moe_aux_loss(model, loss)
            assert set(trainer.moe_stats.take()) >= set(MOE_KEYS)
        loss.backward()
        grads.append(model.get_decoder().layers[1].mlp.gate.weight.grad.numpy().copy())
    assert np.abs(grads[1] - grads[0]).max() > 1e-6


def test_the_aux_loss_joins_the_dpo_loss_and_its_stats_the_log(tiny_moe_dir):
    """`DPOTrainer.preference_loss` adds the policy forward's weighted router loss to the
    preference objective and hands its ``moe/*`` stats to the log (before, DPO on an MoE policy
    trained its routers without the load-balancing loss and logged no router stats)."""
    import types

    from dpo.dpo_trainer import DPOTrainer
    from ppo.models.loading import load_causal_lm

    model = load_causal_lm(tiny_moe_dir)
    model.config.router_aux_loss_coef = 10.0
    model.train()
    trainer = DPOTrainer.__new__(DPOTrainer)
    trainer.args, trainer.packed_length, trainer.use_reference = types.SimpleNamespace(logprob_chunk_size=0), None, False
    trainer.loss_fn = types.SimpleNamespace(data="pairs", kl_point=False)
    seen = {}
    trainer.preference_objective = lambda logps, *rest: (seen.setdefault("objective", -logps.sum()), {"loss/dpo": -logps.sum()})
    ids = paddle.to_tensor([[1, 4, 7, 30, 31, 2, 9, 12]])
    labels = paddle.to_tensor([[-100, -100, -100, -100, 31, 2, 9, 12]])
    inputs = {f"{side}_{key}": value for side in ("better", "worse")
              for key, value in (("input_ids", ids), ("attention_mask", paddle.ones_like(ids)), ("labels", labels))}
    loss, stats = trainer.preference_loss(model, inputs)
    assert set(stats) >= set(MOE_KEYS) | {"loss/dpo"} and float(stats["moe/aux_loss"]) > 0
    aux = float(loss) - float(seen["objective"])
    np.testing.assert_allclose(aux, 10.0 * float(stats["moe/aux_loss"]), rtol=1e-5)


def test_the_aux_loss_joins_the_reward_model_loss_and_its_stats_the_log(tiny_moe_dir):
    """A score model on an MoE backbone keeps its forward's weighted router loss, and
    `RewardTrainer.compute_loss` adds it to the pairwise loss and logs the ``moe/*`` stats (before,
    reward models on MoE trained their routers without the load-balancing loss, unlogged)."""
    import types

    from ppo.models.score_model import AutoModelForScore, pair_scores_loss
    from rm.reward_trainer import RewardTrainer

    model = AutoModelForScore.from_pretrained(tiny_moe_dir, score_type="reward")
    model.config.router_aux_loss_coef = 10.0
    model.train()
    trainer = RewardTrainer.__new__(RewardTrainer)
    trainer.args, trainer.packed_length = types.SimpleNamespace(loss_type="sequence-wise", regularization=0.0), None
    better, worse = paddle.to_tensor([[1, 4, 7, 30, 31, 2]]), paddle.to_tensor([[1, 4, 7, 30, 9, 2]])
    inputs = {"better_input_ids": better, "worse_input_ids": worse, "better_attention_mask": paddle.ones_like(better),
              "worse_attention_mask": paddle.ones_like(worse)}
    loss = trainer.compute_loss(model, inputs)
    stats = trainer.moe_stats.take()
    assert set(stats) >= set(MOE_KEYS) and stats["moe/aux_loss"] > 0
    with paddle.no_grad():
        out = model(paddle.concat([better, worse]), paddle.ones([2, 6], "int64"))
    pair_loss, _ = pair_scores_loss(out.scores, out.end_scores, better, worse, inputs["better_attention_mask"],
                                    inputs["worse_attention_mask"], "sequence-wise", 0.0)
    np.testing.assert_allclose(float(loss) - float(pair_loss), 10.0 * stats["moe/aux_loss"], rtol=1e-4)
