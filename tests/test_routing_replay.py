"""Routing replay (`moe_routing_replay rollout`, R3): the experts the rollout engine routed each
token to ride with the experience's rows and the actor's forwards replay them.

The tiny Qwen3-MoE's engine and training forward agree within 1e-6 in float32, so their routings
agree too; a rollout whose router differs from the trained one (its gate weights moved by noise,
as a lower-precision inference engine or a stale weight copy moves them) shows what replay
fixes: the replayed forward's log-probs stay within 6.5e-4 of the rollout's where the forward's
own routing is 1.6e-2 away, and 87% of the replayed tokens' own top-k sets equal the rollout's."""
import numpy as np
import paddle
import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.experience import Experience, merge_rows, response_logprobs
from ppo.models.causal_lm import position_ids_from_mask
from ppo.models.routing_replay import agreement_metric, replay_kwargs, rollout_routing

PROMPTS = [[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [0, 0, 0, 4, 5, 6]]


@pytest.fixture(scope="module")
def tiny_moe_dir(tmp_path_factory):
    from ppo.tiny.factory import build_tiny

    path = str(tmp_path_factory.mktemp("tiny_qwen3_moe_replay"))
    build_tiny(path, seed=5, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, arch="qwen3_moe")
    return path


def load(path, router_noise=0.0):
    """The tiny MoE, its routers' gate weights plus Normal(0, router_noise x mean |w|) noise (seed 1)."""
    from ppo.models.loading import load_causal_lm

    model = load_causal_lm(path)
    model.eval()
    paddle.seed(1)
    for layer in model.qwen3_moe.moe_layers():
        gate = layer.mlp.gate.weight
        if router_noise:
            gate.set_value(gate + paddle.normal(0.0, router_noise * float(gate.abs().mean()), gate.shape))
    return model


@pytest.fixture(scope="module")
def rollout(tiny_moe_dir):
    """`(experience with routing, the engine's response log-probs)` of 3 left-padded prompts."""
    from ppo.rollout import RolloutEngine
    from ppo.rollout.params import SamplingParams

    engine = RolloutEngine(load(tiny_moe_dir), eos_token_id=2, pad_token_id=0, record_routing=True)
    out = engine.generate(paddle.to_tensor(PROMPTS, dtype="int64"), params=SamplingParams(max_new_tokens=12,
                                                                                          min_new_tokens=12), seed=3)
    mask = out.attention_mask
    exp = Experience(prompt_len=6, sequences=out.sequences, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                     response_ids=out.response_ids, response_mask=out.response_mask, group_ids=paddle.zeros([3], "int64"),
                     src=[""] * 3, label=[None] * 3, prompt_text=[""] * 3)
    exp.routing = rollout_routing(out.expert_indices, mask)
    return exp, out.response_logprobs.numpy()


def replayed(model, exp, replay=True, remove_padding=False):
    with paddle.no_grad():
        return response_logprobs(model, exp, 1.0, replay=replay, remove_padding=remove_padding)[0].numpy()


def test_routing_is_aligned_to_the_sequences_with_padding_not_replayed(rollout):
    exp, _ = rollout
    routing = exp.routing.numpy()
    assert routing.shape == (3, 18, 1, 2) and routing.dtype == np.int32  # one MoE layer (layer 0 is dense), top-2
    real = exp.attention_mask.numpy() != 0
    assert (routing[~real] == -1).all()  # left padding: the block routes it itself
    ran = real.copy()
    ran[:, -1] = False  # every row generated 12 tokens: its last one, never run by the engine, is not replayed
    assert (routing[:, -1] == -1).all() and ((routing[ran] >= 0) & (routing[ran] < 4)).all()


def test_the_replayed_forward_matches_the_rollout_better_than_its_own_routing(tiny_moe_dir, rollout):
    exp, engine_logprobs = rollout
    mask = exp.response_mask.numpy() > 0

    def diff(logprobs):
        return float(np.abs(logprobs - engine_logprobs)[mask].max())

    same = load(tiny_moe_dir)  # the rollout's own weights: one routing either way
    assert diff(replayed(same, exp, replay=False)) < 1e-5 and diff(replayed(same, exp)) < 1e-5
    assert agreement_metric(same) == {"moe/replay_agreement": 1.0}
    moved = load(tiny_moe_dir, router_noise=0.3)
    own = diff(replayed(moved, exp, replay=False))
    assert agreement_metric(moved) == {}  # the forward without replay counts nothing
    replay = diff(replayed(moved, exp))
    agreement = agreement_metric(moved)["moe/replay_agreement"]
    assert own > 1e-2 and replay < 1e-3 and own > 10 * replay, (own, replay)  # measured: 1.6e-2 vs 6.5e-4
    assert 0.8 < agreement < 0.95, agreement  # measured 0.870 (40 of 46 replayed tokens)
    np.testing.assert_allclose(replayed(moved, exp, remove_padding=True), replayed(moved, exp), atol=2e-6)


def test_routing_follows_the_rows_through_a_shuffle_and_a_merge(tiny_moe_dir, rollout):
    exp, _ = rollout
    model = load(tiny_moe_dir, router_noise=0.3)
    full = replayed(model, exp)
    perm = [2, 0, 1]
    shuffled = exp.select(perm)
    np.testing.assert_array_equal(shuffled.routing.numpy(), exp.routing.numpy()[perm])
    np.testing.assert_allclose(replayed(model, shuffled), full[perm], atol=2e-6)
    # merged draws of other widths: routing padded with -1 left of the prompt and right of the response
    narrow = exp.select([2])  # row 2 with two of its three padding columns and its last two tokens cut
    narrow.prompt_len, narrow.sequences = 4, exp.sequences[2:3, 2:16]
    narrow.attention_mask, narrow.routing = exp.attention_mask[2:3, 2:16], exp.routing[2:3, 2:16]
    narrow.position_ids, narrow.response_ids = position_ids_from_mask(narrow.attention_mask), exp.response_ids[2:3, :10]
    narrow.response_mask = exp.response_mask[2:3, :10]
    merged = merge_rows([exp.select([0]), narrow], pad_id=0)
    assert merged.routing.shape == [2, 18, 1, 2]
    assert (merged.routing.numpy()[1, :2] == -1).all() and (merged.routing.numpy()[1, 16:] == -1).all()
    np.testing.assert_array_equal(merged.routing.numpy()[1, 2:16], exp.routing.numpy()[2, 2:16])
    np.testing.assert_allclose(replayed(model, merged)[1, :10], full[2, :10], atol=2e-6)


def test_the_passes_replay_for_the_actor_only(tiny_moe_dir, rollout):
    """`PlainPasses`: the actor's old log-probs and training forward replay the rollout's
    experts, the reference (here the same weights as a separate model) routes itself, and the
    update's micro-batch reports `moe/replay_agreement` of its own forward only."""
    from ppo.models.ppo_models import PPOModels
    from ppo.passes.plain import PlainPasses

    exp, _ = rollout
    actor, reference = load(tiny_moe_dir, router_noise=0.3), load(tiny_moe_dir, router_noise=0.3)
    passes = PlainPasses(PPOModels(actor=actor, reference=reference, reward=None, critic=None), actor, {}, 1.0, 0, 2)
    with paddle.no_grad():
        old, ref = passes.logprobs("actor", exp).numpy(), passes.logprobs("reference", exp).numpy()
    assert agreement_metric(actor) == {}  # the old log-prob pass is not the update's
    np.testing.assert_allclose(old, replayed(actor, exp), atol=2e-6)
    np.testing.assert_allclose(ref, replayed(reference, exp, replay=False), atol=2e-6)
    assert np.abs(old - ref).max() > 1e-2  # the routing differs where the rollout's router and theirs disagree
    agreement_metric(actor)
    forward = passes.training_forward(exp.select([2, 0]))
    np.testing.assert_allclose(forward["logprobs"].numpy(), old[[2, 0]], atol=2e-6)
    assert 0.8 < agreement_metric(actor)["moe/replay_agreement"] < 1.0


def test_a_recomputed_layer_replays_the_routing_too(tiny_moe_dir):
    """With `recompute` the layer's forward runs again in the backward: it must see the replayed
    experts (before, the second run routed by itself and Paddle's recompute failed)."""
    ids = paddle.to_tensor([[1, 5, 6, 7, 8, 9, 10, 11, 12, 13]], dtype="int64")
    routing = paddle.to_tensor(np.tile(np.array([0, 1], dtype="int32"), (1, 10, 1, 1)))
    grads = []
    for recompute in (False, True):
        model = load(tiny_moe_dir, router_noise=0.5)
        model.train()
        model.qwen3_moe.enable_recompute, model.config.recompute_granularity = recompute, "full"
        model(input_ids=ids, return_dict=True, **replay_kwargs(routing)).logits.sum().backward()
        grads.append([p.grad.numpy().copy() for p in (model.qwen3_moe.layers[1].mlp.experts[0].down_proj.weight,
                                                        model.qwen3_moe.layers[0].self_attn.q_proj.weight)])
    for plain, recomputed in zip(*grads):
        np.testing.assert_allclose(recomputed, plain, rtol=1e-5, atol=1e-6)


def refusal(tmp_path, *flags):
    from ppo.entry.ppo_argument_checks import validate_arguments
    from tests.test_paddlenlp_dropin import entry_classes

    with pytest.raises(ArgumentError) as info:
        parse_arguments(entry_classes("ppo"), ["--output_dir", str(tmp_path / "out"), "--use_rule_reward", "true", "--adv_estimator", "grpo", "--rollout_n", "2",
                                               "--moe_routing_replay", "rollout", *flags], validate=validate_arguments)
    return str(info.value)


@pytest.mark.parametrize("flags, line", [
    (("--use_fusemt", "false"), "moe_routing_replay rollout with use_fusemt false: PaddleNLP's generate (the fallback "
                                "rollout) does not record"),
    (("--env_name", "calculator"), "moe_routing_replay rollout with env_name: the multi-turn (agent) rollout does not "
                                   "record routing"),
    (("--rollout_placement", "split"), "moe_routing_replay rollout with rollout_placement split"),
])
def test_a_rollout_that_cannot_record_is_refused_by_name(tmp_path, tiny_moe_dir, flags, line):
    message = refusal(tmp_path, "--actor_model_name_or_path", tiny_moe_dir, *flags)
    assert line in message, message


def test_pipeline_stages_are_refused(tmp_path, tiny_moe_dir):
    """A launch with pipeline stages (one process reads pipeline_parallel_degree as -1)."""
    from ppo.entry.routing_replay_arguments import routing_replay_problems
    from tests.test_paddlenlp_dropin import entry_classes

    model_args, _, args = parse_arguments(entry_classes("ppo"), [
        "--output_dir", str(tmp_path), "--moe_routing_replay", "rollout", "--actor_model_name_or_path", tiny_moe_dir])
    assert routing_replay_problems(model_args, args) == []
    args.pipeline_parallel_degree = 2
    assert routing_replay_problems(model_args, args) == [
        "moe_routing_replay rollout with pipeline_parallel_degree 2: the pipeline stages do not take the recorded "
        "experts; set pipeline_parallel_degree 1"]


def test_replay_with_a_dense_policy_is_refused(tmp_path, tiny_model_dir, tiny_moe_dir):
    message = refusal(tmp_path, "--actor_model_name_or_path", tiny_model_dir)
    assert ("moe_routing_replay rollout: actor_model_name_or_path is a dense llama model (no routed experts to replay)"
            in message), message
    message = refusal(tmp_path, "--actor_model_name_or_path", tiny_moe_dir, "--moe_routing_replay", "r3")
    assert "moe_routing_replay" in message and "'rollout'" in message, message  # an unknown value: the valid names


@pytest.mark.slow
def test_grpo_with_routing_replay_through_the_entry_point(tmp_path, tiny_moe_dir, tiny_data_dir):
    """2 GRPO steps with `moe_routing_replay rollout` and the old log-probs recomputed
    (`use_rollout_logprobs false`, so `rollout/logprob_diff_*` compare the engine's with the
    replayed training forward's): every step logs the mismatch (float32: under 1e-5), the
    agreement of the update's forward (its weights are the rollout's: 1.0; it read 0.9964 when a
    row's stop token kept the experts of the engine's finished-row pass) and finite losses."""
    from ppo.run_ppo import build_trainer
    from tests.test_ppo_trainer import read_metrics

    out = str(tmp_path / "grpo")
    trainer = build_trainer([
        "config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", tiny_moe_dir,
        "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", "2", "--per_device_prompt_batch_size", "4", "--rollout_n", "4", "--per_device_train_batch_size", "16",
        "--update_iters", "1", "--max_dec_len", "6", "--evaluation_strategy", "no", "--save_steps", "0",
        "--num_sample_generations", "0", "--learning_rate", "1e-3", "--disable_tqdm", "true",
        "--use_rollout_logprobs", "false", "--moe_routing_replay", "rollout",
        "--rule_reward_scorers", "tests.rule_reward_helpers:_char_recall_scorer"])
    assert trainer.experience.rollout.engine.record_routing
    trainer.train()
    lines = [r for r in read_metrics(out) if "objective/scores" in r]
    assert len(lines) == 2
    for line in lines:
        assert line["moe/replay_agreement"] == 1.0, line
        assert 0 <= line["rollout/logprob_diff_mean"] <= line["rollout/logprob_diff_max"] < 1e-5, line
        assert np.isfinite(line["loss/policy_avg"]) and line["moe/aux_loss"] > 0, line
