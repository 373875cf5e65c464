"""A reward model with its own tokenizer: the tokenizers are compared at start and rollouts are
re-tokenised for the reward model. The check: a reward model whose tokenizer permutes the
actor's ids (same vocabulary size), with its embedding rows permuted to match, is the same
function of text, so re-tokenised scores equal the original model's scores; the actor's ids
fed to it unchanged score other text."""
import json
import os
import shutil
import types

import numpy as np
import paddle
import pytest

from ppo.data import DEMO_TEMPLATE
from ppo.models.loading import load_tokenizer
from ppo.models.reward_tokens import RewardRetokenizer, reward_retokenizer_for, reward_scores, tokenizer_differences
from ppo.models.score_model import AutoModelForScore
from ppo.run_ppo import main as run_ppo
from tests.test_ppo_trainer import ppo_argv


def permuted_sentencepiece():
    """The tiny tokenizer's SentencePiece char model trained on a corpus where later symbols are
    more frequent: the same pieces and vocabulary size, other ids."""
    import io

    import sentencepiece as spm

    from ppo.tiny import factory

    buf = io.BytesIO()
    corpus = [" ".join(factory.SYMBOLS[k:]) for k in range(len(factory.SYMBOLS))]  # symbol k appears k + 1 times
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=buf, model_type="char",
        vocab_size=len(factory.SPECIAL_IDS) + len(factory.TEMPLATE_WORDS) + len(factory.SYMBOLS) + 1,
        user_defined_symbols=factory.TEMPLATE_WORDS, unk_id=0, bos_id=1, eos_id=2, pad_id=3, add_dummy_prefix=False,
        remove_extra_whitespaces=False, normalization_rule_name="identity", character_coverage=1.0, minloglevel=2,
        num_threads=1,
    )
    return buf.getvalue()


def permuted_copy(rm_dir, out_dir):
    """`rm_dir` with a tokenizer that gives the same pieces other ids, its embedding rows moved
    with them; returns `{old id: new id}`."""
    from paddlenlp.transformers import LlamaTokenizer

    shutil.copytree(rm_dir, out_dir)
    vocab_file = os.path.join(out_dir, "sentencepiece.bpe.model")
    open(vocab_file, "wb").write(permuted_sentencepiece())
    old_tok = load_tokenizer(rm_dir)
    new_tok = LlamaTokenizer(vocab_file=vocab_file, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                             pad_token="<pad>", add_bos_token=True, add_eos_token=False, padding_side="left")
    new_tok.save_pretrained(out_dir)
    new_vocab = new_tok.get_vocab()
    new_id = {i: new_vocab[piece] for piece, i in old_tok.get_vocab().items()}
    assert sorted(new_id) == sorted(new_id.values()) and any(k != v for k, v in new_id.items())
    weights_path = os.path.join(out_dir, "model_state.pdparams")
    state = paddle.load(weights_path)
    for key, value in state.items():
        if "embed_tokens" in key:
            rows = value.numpy()
            moved = rows.copy()
            for old, new in new_id.items():
                moved[new] = rows[old]
            state[key] = paddle.to_tensor(moved)
    paddle.save(state, weights_path)
    return new_id


@pytest.fixture(scope="module")
def permuted_rm_dir(tiny_rm_dir, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("permuted") / "rm")
    permuted_copy(tiny_rm_dir, path)
    return path


def rollout(tokenizer, inputs, answers):
    """An experience-like batch: equal-length prompts and EOS-ended responses, no padding."""
    prompts = [DEMO_TEMPLATE.format(input=x) for x in inputs]
    prompt_ids = [list(tokenizer(p)["input_ids"]) for p in prompts]
    response_ids = [list(tokenizer(a, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id] for a in answers]
    sequences = paddle.to_tensor([p + r for p, r in zip(prompt_ids, response_ids)], dtype="int64")
    mask = paddle.ones_like(sequences)
    return types.SimpleNamespace(
        sequences=sequences, attention_mask=mask, position_ids=paddle.cumsum(mask, axis=1) - 1,
        response_ids=paddle.to_tensor(response_ids, dtype="int64"),
        response_mask=paddle.ones([len(answers), len(response_ids[0])], dtype="float32"),
        prompt_text=prompts, ends_with_eos=paddle.to_tensor([True] * len(answers)),
    )


def test_tokenizer_differences_name_moved_ids(tiny_rm_dir, permuted_rm_dir):
    actor, permuted = load_tokenizer(tiny_rm_dir), load_tokenizer(permuted_rm_dir)
    assert tokenizer_differences(actor, load_tokenizer(tiny_rm_dir)) == []
    found = tokenizer_differences(actor, permuted)
    assert len(actor.get_vocab()) == len(permuted.get_vocab())
    assert len(found) == 1 and "tokens have other ids" in found[0]
    assert reward_retokenizer_for(actor, load_tokenizer(tiny_rm_dir)) is None
    with pytest.raises(ValueError, match="critic's tokenizer differs"):
        reward_retokenizer_for(actor, permuted, critic_tokenizer=permuted)
    with pytest.raises(ValueError, match="pipeline_parallel_degree"):
        reward_retokenizer_for(actor, permuted, pipeline=True)


def test_retokenised_scores_equal_the_original_reward_model(tiny_rm_dir, permuted_rm_dir):
    actor_tok, permuted_tok = load_tokenizer(tiny_rm_dir), load_tokenizer(permuted_rm_dir)
    exp = rollout(actor_tok, ["Reverse: abc", "Reverse: k3x", "Reverse: 9qz"], ["cba", "x3k", "zq9"])
    original = reward_scores(AutoModelForScore.from_pretrained(tiny_rm_dir).eval(), exp).numpy()
    permuted_rm = AutoModelForScore.from_pretrained(permuted_rm_dir).eval()
    retokenizer = RewardRetokenizer(actor_tok, permuted_tok)
    ids, _, _ = retokenizer.encode(exp)
    assert ids.shape == exp.sequences.shape and not np.array_equal(ids.numpy(), exp.sequences.numpy())
    np.testing.assert_allclose(reward_scores(permuted_rm, exp, retokenizer).numpy(), original, rtol=1e-5, atol=1e-6)
    silently_wrong = reward_scores(permuted_rm, exp).numpy()
    assert np.abs(silently_wrong - original).max() > 1e-4


def test_ppo_run_with_a_differently_tokenised_reward_model(tiny_model_dir, tiny_rm_dir, permuted_rm_dir, tiny_data_dir, tmp_path, caplog):
    out = str(tmp_path / "ppo")
    argv = ppo_argv(tiny_model_dir, permuted_rm_dir, tiny_data_dir, out, "--max_steps", "1")
    with pytest.raises(ValueError, match="critic's tokenizer differs"):  # the critic starts from the reward model
        run_ppo(argv)
    run_ppo(argv + ["--reward_critic_model_name_or_path", tiny_rm_dir])
    assert "re-tokenised for the reward model" in caplog.text
    row = json.loads(open(os.path.join(out, "metrics.jsonl")).readline())
    assert np.isfinite(row["objective/scores"])
