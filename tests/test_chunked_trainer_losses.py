"""The trainers' losses with chunked LM-head log-probs equal the old full-logits formulas on
a tiny model (values and gradients): PPO actor loss + entropy, SFT loss, DPO answer log-probs,
PPO's ptx loss; plus the `Experience` stage markers."""
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from ppo.algos import entropy_bonus_loss, entropy_from_logits, masked_mean, ppo_policy_loss, sft_loss, token_logprobs
from ppo.experience import Experience, ObjectiveTrace, response_logprobs, response_slice
from ppo.models.causal_lm import position_ids_from_mask
from ppo.models.loading import load_causal_lm


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    m = load_causal_lm(tiny_model_dir)
    m.eval()
    return m


def vocab(model):
    return model.config.vocab_size


def make_experience(model, seed=0, N=4, Tp=5, Tr=6):
    rng = np.random.default_rng(seed)
    V = vocab(model)
    prompt_mask = np.ones((N, Tp), "int64")
    prompt_mask[1, :2] = 0
    prompt_mask[3, :1] = 0
    lengths = np.array([6, 3, 1, 4])
    response_mask = (np.arange(Tr)[None, :] < lengths[:, None]).astype("float32")
    seq = rng.integers(3, V, size=(N, Tp + Tr))
    attn = np.concatenate([prompt_mask, response_mask.astype("int64")], axis=1)
    attn_t = paddle.to_tensor(attn)
    return Experience(
        prompt_len=Tp,
        sequences=paddle.to_tensor(seq),
        attention_mask=attn_t,
        position_ids=position_ids_from_mask(attn_t),
        response_ids=paddle.to_tensor(seq[:, Tp:]),
        response_mask=paddle.to_tensor(response_mask),
        group_ids=paddle.arange(N, dtype="int64"),
        src=["s"] * N, label=[None] * N, prompt_text=["p"] * N,
        old_logprobs=paddle.to_tensor(rng.normal(-2.0, 0.3, size=(N, Tr)).astype("float32")),
        advantages=paddle.to_tensor(rng.normal(size=(N, Tr)).astype("float32")),
    )


def old_response_logprobs(model, exp, temperature):
    """The pre-chunking formula: full logits, sliced to the response, token_logprobs * mask."""
    out = model(input_ids=exp.sequences, attention_mask=exp.attention_mask, position_ids=exp.position_ids, return_dict=True)
    logits = response_slice(out.logits.astype("float32"), exp.prompt_len, exp.response_ids.shape[1])
    return token_logprobs(logits, exp.response_ids, temperature=temperature) * exp.response_mask, logits


def param_grads(model):
    out = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    model.clear_gradients()
    return out


def ppo_args(chunk, temperature=0.8, entropy_coeff=0.0):
    from ppo.entry.ppo_arguments import PPOTrainingArguments

    return PPOTrainingArguments(output_dir="/tmp/unused_chunk_test", logprob_chunk_size=chunk, temperature=temperature,
                                clip_range_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=entropy_coeff)


def updater_stub(args):
    """Just what `PPOUpdater.actor_loss` reads: its slice of the arguments."""
    from ppo.trainer.settings import UpdateSettings, slice_of
    from ppo.trainer.updater import PPOUpdater

    from ppo.algos import get_policy_loss

    stub = SimpleNamespace(settings=slice_of(UpdateSettings, args), policy_loss=get_policy_loss(args.policy_loss))
    stub.policy_settings = stub.policy_loss.settings_from(stub.settings)
    stub.aggregation = lambda num_tokens, num_seqs: PPOUpdater.aggregation(stub, num_tokens, num_seqs)
    return stub


@pytest.mark.parametrize("chunk, entropy_coeff", [(3, 0.0), (7, 0.05), (512, 0.05)])
def test_ppo_actor_loss_and_entropy_match_full_logits(model, chunk, entropy_coeff):
    from ppo.trainer.updater import PPOUpdater

    exp = make_experience(model)
    num_tokens, num_seqs = float(exp.response_mask.sum()), 4.0
    model.clear_gradients()
    # old path: full logits, entropy from the logits under no_grad
    lp_old, logits = old_response_logprobs(model, exp, 0.8)
    loss_old, stats_old = ppo_policy_loss(lp_old, exp.old_logprobs, exp.advantages, exp.response_mask, clip_range_ratio=0.2,
                                          loss_agg_mode="token-mean", num_tokens=num_tokens, num_seqs=num_seqs)
    ent_old = masked_mean(entropy_from_logits(logits / 0.8), exp.response_mask)
    if entropy_coeff:  # the bonus's gradient flows through the chunked entropy too
        bonus, _ = entropy_bonus_loss(logits, exp.response_mask, 0.8, "token-mean", num_tokens, num_seqs)
        loss_old = loss_old - entropy_coeff * bonus
    loss_old.backward()
    g_old = param_grads(model)

    args = ppo_args(chunk, entropy_coeff=entropy_coeff)
    logprobs, entropy = response_logprobs(model, exp, args.temperature, args.logprob_chunk_size, with_entropy=True)  # the passes' forward
    loss, stats = PPOUpdater.actor_loss(updater_stub(args), exp, {"logprobs": logprobs, "entropy": entropy}, num_tokens, num_seqs)
    loss.backward()
    g_new = param_grads(model)
    np.testing.assert_allclose(float(loss), float(loss_old), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(stats["policy/entropy_avg"]), float(ent_old), rtol=1e-5)
    np.testing.assert_allclose(float(stats["policy/clipfrac_avg"]), float(stats_old["policy/clipfrac_avg"]))
    assert set(g_new) == set(g_old) and "lm_head.weight" in g_new
    for name in g_old:
        np.testing.assert_allclose(g_new[name], g_old[name], rtol=1e-4, atol=1e-7, err_msg=name)


def test_response_logprobs_full_and_chunked_agree(model):
    exp = make_experience(model, seed=1)
    with paddle.no_grad():
        old, _ = old_response_logprobs(model, exp, 1.0)
        full, ent_full = response_logprobs(model, exp, 1.0, 0, with_entropy=True)
        chunked, ent = response_logprobs(model, exp, 1.0, 4, with_entropy=True)
    np.testing.assert_allclose(full.numpy(), old.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(chunked.numpy(), old.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent.numpy(), ent_full.numpy(), rtol=1e-5, atol=1e-5)
    mask = exp.response_mask.numpy()
    assert (chunked.numpy()[mask == 0] == 0).all() and (ent.numpy()[mask == 0] == 0).all()
    assert (ent.numpy()[mask == 1] > 0).all()


def sft_batch(model, seed=2):
    """Right-padded SFT batch: labels -100 on the prompt and the padding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab(model), size=(3, 10))
    attn = np.ones((3, 10), "int64")
    attn[1, 7:] = 0
    attn[2, 5:] = 0
    labels = ids.copy()
    labels[:, :3] = -100
    labels[attn == 0] = -100
    return {"input_ids": paddle.to_tensor(ids), "attention_mask": paddle.to_tensor(attn), "labels": paddle.to_tensor(labels)}


@pytest.mark.parametrize("chunk", [0, 2, 512])
def test_sft_loss_matches_full_logits(model, chunk):
    from sft.sft_trainer import SFTTrainer

    inputs = sft_batch(model)
    model.clear_gradients()
    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], return_dict=True).logits
    old, _ = sft_loss(logits[:, :-1], inputs["labels"][:, 1:])
    old.backward()
    g_old = param_grads(model)
    loss = SFTTrainer.compute_loss(SimpleNamespace(args=SimpleNamespace(logprob_chunk_size=chunk)), model, inputs)
    loss.backward()
    g_new = param_grads(model)
    np.testing.assert_allclose(float(loss), float(old), rtol=1e-5)
    for name in g_old:
        np.testing.assert_allclose(g_new[name], g_old[name], rtol=1e-4, atol=1e-7, err_msg=name)


def test_dpo_answer_logprobs_and_ptx_loss_chunked_equal_full(model):
    from dpo.dpo_trainer import answer_logprobs
    from ppo.passes.plain import ptx_nll

    inputs = sft_batch(model, seed=3)
    args = (inputs["input_ids"], inputs["attention_mask"], inputs["labels"])
    with paddle.no_grad():
        full = answer_logprobs(model, *args, chunk_size=0)
        chunked = answer_logprobs(model, *args, chunk_size=3)
    for a, b in zip(full, chunked):
        np.testing.assert_allclose(b.numpy().astype("float64"), a.numpy().astype("float64"), rtol=1e-5, atol=1e-5)
    assert (full[1].numpy() == [7, 4, 2]).all()  # answer tokens 3..9, 3..6, 3..4

    losses = [float(ptx_nll(model, inputs, chunk)) for chunk in (0, 4)]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    assert losses[0] > 0


def test_experience_stages(model):
    exp = make_experience(model)
    assert exp.stage == "rollout"
    with pytest.raises(RuntimeError, match="needs a 'complete' experience"):
        exp.require("complete")
    with pytest.raises(ValueError, match="scores"):
        exp.advance("scored")
    exp.objectives["reward"] = ObjectiveTrace(paddle.zeros([len(exp)]))
    exp.advance("scored")
    with pytest.raises(ValueError, match="ref_logprobs"):
        exp.advance("complete")
    exp.ref_logprobs = exp.old_logprobs
    with pytest.raises(ValueError, match="reward.rewards"):
        exp.advance("complete")
    exp.objectives["reward"].rewards = exp.objectives["reward"].advantages = exp.advantages
    exp.advance("complete")
    exp.require("scored")
    assert exp.select([0, 2]).stage == "complete" and Experience.concat([exp, exp]).stage == "complete"
