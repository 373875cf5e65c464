"""`use_remove_padding` (PPO / GRPO): padded rows repacked without their padding
(`ppo.models.unpadded`), and the plain passes run on them giving the padded passes' log-probs,
values, losses and gradients; the argument is real, documented, and refused with pipelines."""
import numpy as np
import paddle
import pytest

from ppo.algos import ppo_policy_loss, value_loss
from ppo.experience import Experience, ObjectiveTrace
from ppo.models.loading import load_causal_lm
from ppo.models.ppo_models import PPOModels
from ppo.models.score_model import AutoModelForScore
from ppo.models.unpadded import pack_padded
from ppo.passes import PlainPasses, UpdateLosses


def test_pack_padded_layout_and_round_trip():
    """Rows [_ a a a], [b b _ _], [_ c _ _] (left and right padding) into rows of 4 tokens:
    the 3 first, then b (2) fills the next row and c (1) joins a."""
    mask = np.array([[0, 1, 1, 1], [1, 1, 0, 0], [0, 1, 0, 0]])
    ids = np.array([[0, 11, 12, 13], [21, 22, 0, 0], [0, 31, 0, 0]])
    packed = pack_padded(ids, mask)
    np.testing.assert_array_equal(packed.input_ids.numpy(), [[11, 12, 13, 31], [21, 22, 0, 0]])
    np.testing.assert_array_equal(packed.position_ids.numpy(), [[0, 1, 2, 0], [0, 1, 0, 0]])
    att = packed.attention_mask.numpy()[:, 0]
    assert att[0, 2, 0] and not att[0, 3, 2] and att[0, 3, 3] and not att[1, 2, 1] and att[1, 2, 2]
    np.testing.assert_array_equal(packed.ends, [2, 5, 3])  # flat cells r*4 + c of each row's last token
    back = packed.to_padded(paddle.to_tensor(packed.input_ids.numpy() * 10.0))
    np.testing.assert_array_equal(back.numpy(), ids * 10.0)  # 0 on padding
    np.testing.assert_array_equal(packed.to_packed(ids).numpy(), packed.input_ids.numpy())


def test_rows_with_a_gap_are_refused():
    with pytest.raises(ValueError, match="row 1 has padding between its real tokens"):
        pack_padded(np.ones([2, 4], "int64"), np.array([[1, 1, 1, 0], [1, 0, 1, 0]]))


def rollout(vocab, seed=0):
    """A hand-made complete experience: left-padded prompts of 2..5 tokens, right-padded
    responses of 1..7 tokens, random old log-probs, advantages and returns."""
    rng = np.random.default_rng(seed)
    N, P, Tr = 6, 5, 7
    prompt_lens, response_lens = [5, 2, 3, 4, 2, 5], [7, 1, 4, 3, 6, 2]
    seq = np.zeros([N, P + Tr], "int64")
    mask = np.zeros([N, P + Tr], "int64")
    for n in range(N):
        seq[n, P - prompt_lens[n]:P + response_lens[n]] = rng.integers(3, vocab, prompt_lens[n] + response_lens[n])
        mask[n, P - prompt_lens[n]:P + response_lens[n]] = 1
    seq[mask == 0] = rng.integers(3, vocab, int((mask == 0).sum()))  # garbage under the padding
    response_mask = mask[:, P:].astype("float32")
    t = lambda x, dtype="float32": paddle.to_tensor(np.asarray(x, dtype=dtype))  # noqa: E731
    exp = Experience(
        prompt_len=P, sequences=t(seq, "int64"), attention_mask=t(mask, "int64"),
        position_ids=t(np.clip(mask.cumsum(1) - 1, 0, None), "int64"), response_ids=t(seq[:, P:], "int64"),
        response_mask=t(response_mask), group_ids=t(np.arange(N) // 2, "int64"), src=[""] * N, label=[None] * N,
        prompt_text=[""] * N,
    )
    exp.old_logprobs = t(-rng.uniform(1, 5, [N, Tr]) * response_mask)
    exp.advantages = t(rng.normal(size=[N, Tr]) * response_mask)
    exp.objectives["reward"] = ObjectiveTrace(t(np.zeros([N])), values=t(rng.normal(size=[N, Tr]) * response_mask),
                                              returns=t(rng.normal(size=[N, Tr]) * response_mask))
    return exp


@pytest.fixture(scope="module")
def models(tiny_model_dir, tiny_rm_dir):
    actor = load_causal_lm(tiny_model_dir)
    critic = AutoModelForScore.from_pretrained(tiny_rm_dir, score_type="critic", do_normalize=False, normalizer_type=None)
    return PPOModels(actor=actor, reference=load_causal_lm(tiny_model_dir), reward=None, critic=critic)


def passes(models, remove_padding, chunk=16):
    return PlainPasses(models, models.actor, {"reward": models.critic}, temperature=0.7, logprob_chunk_size=chunk, chunk_rows=4,
                       remove_padding=remove_padding)


@pytest.mark.parametrize("chunk", [16, 0])
def test_no_gradient_passes_match_padding(models, chunk):
    """Actor and reference log-probs and critic values, in row chunks of 4 (two packings)."""
    exp = rollout(models.actor.config.vocab_size)
    padded, packed = passes(models, False, chunk), passes(models, True, chunk)
    with paddle.no_grad():
        for which in ("actor", "reference"):
            np.testing.assert_allclose(packed.logprobs(which, exp).numpy(), padded.logprobs(which, exp).numpy(),
                                       rtol=1e-5, atol=1e-5)
        values = packed.values("reward", exp).numpy()
        np.testing.assert_allclose(values, padded.values("reward", exp).numpy(), rtol=1e-5, atol=1e-6)
    assert (np.abs(values) > 0).sum() == exp.response_mask.numpy().sum()  # a value on every response token only


def update_losses(exp):
    tokens = float(exp.response_mask.sum())

    def actor(mb, forward):
        loss, _ = ppo_policy_loss(forward["logprobs"], mb.old_logprobs, mb.advantages, mb.response_mask,
                                  num_tokens=tokens)
        entropy = (forward["entropy"] * mb.response_mask).sum() / tokens
        return loss - 0.01 * entropy, {"loss/policy": loss.detach()}

    def critic(mb, forward):
        trace = mb.objectives["reward"]
        loss, _ = value_loss(forward["values"], trace.values, trace.returns, mb.response_mask, clip_range_value=5.0,
                             num_tokens=tokens)
        return loss, {"loss/value": loss.detach()}

    return UpdateLosses(actor=actor, critics={"reward": critic})


def update_grads(models, remove_padding, exp, keep_first):
    for model in (models.actor, models.critic):
        model.clear_gradients()
    runner = passes(models, remove_padding)
    plan = [[0, 2, 4], [1, 3, 5]]
    first = runner.first_forward(exp.select(list(range(len(exp))))) if keep_first else None
    actor_loss, value_totals, _ = runner.backward_step(exp, plan, update_losses(exp), first)
    critic_loss = value_totals["reward"]
    grads = {f"{who}.{n}": p.grad.numpy().copy() for who, m in (("actor", models.actor), ("critic", models.critic))
             for n, p in m.named_parameters() if p.grad is not None}
    return actor_loss, critic_loss, grads


@pytest.mark.parametrize("keep_first", [False, True])
def test_update_gives_the_padded_losses_and_gradients(models, keep_first):
    """One optimiser step's backward over two micro-batches (and with the kept first forward)."""
    exp = rollout(models.actor.config.vocab_size, seed=1)
    pad_actor, pad_critic, pad_grads = update_grads(models, False, exp, keep_first)
    pack_actor, pack_critic, pack_grads = update_grads(models, True, exp, keep_first)
    np.testing.assert_allclose([pack_actor, pack_critic], [pad_actor, pad_critic], rtol=1e-5)
    assert sorted(pack_grads) == sorted(pad_grads) and len(pad_grads) > 10
    for name in pad_grads:
        np.testing.assert_allclose(pack_grads[name], pad_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_pipeline_parallel_is_refused_by_name():
    from types import SimpleNamespace

    from ppo.entry.ppo_argument_checks import remove_padding_problems

    (problem,) = remove_padding_problems(SimpleNamespace(use_remove_padding=True, pipeline_parallel_degree=2))
    assert problem.startswith("use_remove_padding with pipeline_parallel_degree 2") and "set use_remove_padding false" in problem
    assert remove_padding_problems(SimpleNamespace(use_remove_padding=True, pipeline_parallel_degree=1)) == []
    assert remove_padding_problems(SimpleNamespace(use_remove_padding=False, pipeline_parallel_degree=2)) == []


def test_the_paddlenlp_key_reaches_the_passes(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """`use_remove_padding true` parses (no longer refused) and the trainer's passes pack."""
    from ppo.run_ppo import build_trainer
    from tests.test_ppo_trainer import ppo_argv

    out = str(tmp_path / "ppo")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--use_remove_padding", "true"))
    assert trainer.passes.remove_padding
    with open("docs/arguments_rl.md") as f:
        assert "use_remove_padding" in f.read()


def test_a_ppo_step_with_remove_padding_logs_the_padded_step(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """One PPO step (actor, reference, critic, update) of the entry point, packed and padded:
    the same rollout (same seed), so the same log-prob, value and loss metrics and weights."""
    from ppo.run_ppo import build_trainer
    from tests.test_ppo_trainer import ppo_argv, read_metrics, weights

    def run(name, *extra):
        out = str(tmp_path / name)
        trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "1",
                                         "--kl_coeff", "0.1", "--use_rollout_logprobs", "false", *extra))
        trainer.train()
        (record,) = [r for r in read_metrics(out) if "loss/policy_avg" in r]
        return record, weights(trainer.passes.models.actor)

    padded, padded_weights = run("padded")
    packed, packed_weights = run("packed", "--use_remove_padding", "true")
    for key in ("loss/policy_avg", "loss/value_avg", "objective/kl", "objective/entropy", "policy/approxkl_avg"):
        np.testing.assert_allclose(packed[key], padded[key], rtol=1e-4, atol=1e-6, err_msg=key)
    assert padded["response_length/mean"] == packed["response_length/mean"]
    # AdamW's first step moves each weight by about lr * sign(grad): an entry whose gradient is
    # near zero can move differently under float rounding (here 1 of 3,200 embedding entries by
    # 1.1e-4 with lr 1e-3); every other entry agrees to 1e-5
    moved = 0
    for name in padded_weights:
        diff = np.abs(packed_weights[name] - padded_weights[name])
        assert diff.max() < 5e-4, name
        moved += int((diff > 1e-5 + 1e-4 * np.abs(padded_weights[name])).sum())
    assert moved <= 3


def test_lora_grpo_steps_with_remove_padding_log_the_padded_steps(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """GRPO with a LoRA actor (the reference is the actor with its adapter off), two steps
    packed and padded: the same KL, entropy and loss metrics."""
    from ppo.run_ppo import build_trainer
    from tests.test_ppo_trainer import read_metrics

    def run(name, *extra):
        out = str(tmp_path / name)
        trainer = build_trainer([
            "config/tiny/lora_grpo_argument.json", "--actor_model_name_or_path", tiny_model_dir,
            "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl", "--eval_datasets", "",
            "--use_rm_server", "false", "--reward_model_name_or_path", tiny_rm_dir, "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "2", "--evaluation_strategy", "no",
            "--per_device_prompt_batch_size", "4", "--rollout_n", "4", "--per_device_train_batch_size", "8",
            "--max_dec_len", "8", "--save_steps", "0", "--num_sample_generations", "0", "--disable_tqdm", "true",
            "--use_rollout_logprobs", "false", "--kl_loss_coeff", "0.1", "--learning_rate", "1e-2", *extra,
        ])
        trainer.train()
        return [r for r in read_metrics(out) if "loss/policy_avg" in r]

    padded, packed = run("padded"), run("packed", "--use_remove_padding", "true")
    assert len(padded) == len(packed) == 2
    assert padded[1]["objective/kl"] > 1e-6  # the second step's actor moved away from its reference
    for key in ("loss/policy_avg", "objective/kl", "objective/entropy", "policy/approxkl_avg", "response_length/mean"):
        np.testing.assert_allclose([r[key] for r in packed], [r[key] for r in padded], rtol=1e-4, atol=1e-6, err_msg=key)
