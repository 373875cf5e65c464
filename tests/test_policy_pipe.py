"""The last-stage pieces of PPO/GRPO under pipeline parallel (`ppo/strategy/pipeline/policy_pipe.py`) on a
plain model's outputs: response log-probs, entropies and critic values from the last stage's
logits / scores equal the plain trainer's passes; the criterion hands the trainer's loss the
micro-batch's fields and undoes the schedule's division by the number of micro-batches; the
stand-in micro-batch counts nothing."""
import numpy as np
import paddle
import pytest

from ppo.experience import loss_view, response_logprobs, response_values
from ppo.models.loading import load_causal_lm
from ppo.strategy.pipeline.policy_pipe import (
    ExperienceCriterion,
    response_logprobs_from_logits,
    response_values_from_scores,
    row_groups,
    schedule_data,
    padded_micro_batch,
    padded_first_stage_inputs,
    supervised_micro_batch,
)
from ppo.strategy.pipeline.pipe import answer_nll_from_logits
from tests.test_chunked_trainer_losses import make_experience


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    m = load_causal_lm(tiny_model_dir)
    m.eval()
    return m


def logits_of(model, exp):
    return model(input_ids=exp.sequences, attention_mask=exp.attention_mask, position_ids=exp.position_ids, return_dict=True).logits


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_from_logits_equal_the_plain_pass(model, temperature):
    exp = make_experience(model)
    with paddle.no_grad():
        expected, expected_entropy = response_logprobs(model, exp, temperature, chunk_size=0, with_entropy=True)
        got, entropy = response_logprobs_from_logits(logits_of(model, exp), exp, temperature, with_entropy=True)
    assert got.shape == expected.shape == exp.response_mask.shape
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(entropy.numpy(), expected_entropy.numpy(), rtol=1e-5, atol=1e-6)
    assert not got.numpy()[exp.response_mask.numpy() == 0].any()


def test_values_from_scores_equal_the_plain_critic_pass(tiny_rm_dir, model):
    from ppo.models.score_model import AutoModelForScore

    critic = AutoModelForScore.from_pretrained(tiny_rm_dir, score_type="critic", do_normalize=False, normalizer_type=None)
    critic.eval()
    exp = make_experience(model, seed=1)
    with paddle.no_grad():
        scores = critic(exp.sequences, attention_mask=exp.attention_mask, position_ids=exp.position_ids).scores
        np.testing.assert_allclose(
            response_values_from_scores(scores, exp).numpy(), response_values(critic, exp).numpy(), rtol=1e-6, atol=1e-7
        )


def test_criterion_passes_the_fields_and_rescales_the_loss(model):
    exp = make_experience(model, seed=2)
    micro = [exp.select([0, 1]), exp.select([2, 3])]
    (firsts, labels), fields = schedule_data(micro)
    assert fields == ["response_ids", "response_mask", "old_logprobs", "advantages"]  # the fields the experience holds
    assert len(firsts) == 3 and len(firsts[0]) == 2 and firsts[1][0].dtype == paddle.bool
    seen, recorded = [], []

    def objective(mb, output):
        seen.append(mb)
        return (output.sum() + mb.advantages.sum()), {"x": output.sum()}

    criterion = ExperienceCriterion(accumulate_steps=2, record=recorded.append, view=loss_view)
    criterion.prepare(exp.prompt_len, fields, objective)
    out = paddle.ones([2, 3])
    loss = criterion(out, labels[1])
    np.testing.assert_allclose(float(loss), 2 * (6.0 + float(micro[1].advantages.sum())), rtol=1e-6)
    assert seen[0].prompt_len == exp.prompt_len and seen[0].objectives == {} and seen[0].ref_logprobs is None
    np.testing.assert_array_equal(seen[0].old_logprobs.numpy(), micro[1].old_logprobs.numpy())
    assert float(recorded[0]["x"]) == 6.0


def test_padded_micro_batch_and_row_groups(model):
    exp = make_experience(model, seed=3)
    stand_in = padded_micro_batch(exp, [], 3)
    assert len(stand_in) == 3 and float(stand_in.response_mask.sum()) == 0.0
    padded = padded_micro_batch(exp, [2, 1], 4)
    mask = padded.response_mask.numpy()
    np.testing.assert_array_equal(mask[:2], exp.response_mask.numpy()[[2, 1]])
    assert not mask[2:].any() and padded.sequences.shape == [4, exp.sequences.shape[1]]
    assert float(exp.response_mask.sum()) > 0  # the experience itself is untouched
    assert row_groups(5, 2) == [[0, 2, 4], [1, 3]] and row_groups(1, 3) == [[0], [], []]


def test_padded_rows_and_columns_change_no_loss(model):
    """The actor loss of a micro-batch padded to more rows and columns, and the ptx NLL of a
    supervised batch padded the same way, equal the unpadded ones."""
    exp = make_experience(model, seed=4)
    rows = [0, 1]
    plain = padded_micro_batch(exp, rows, 2)
    padded = padded_micro_batch(exp, rows, 4)
    width = exp.sequences.shape[1] + 3
    ids, mask, positions = padded_first_stage_inputs((padded.sequences, padded.attention_mask, padded.position_ids), width, 0)
    assert ids.shape == [4, width] and not mask.numpy()[:, -3:].any()
    with paddle.no_grad():
        logits_plain = logits_of(model, plain)
        logits_padded = model(input_ids=ids, attention_mask=mask.astype("int64"), position_ids=positions, return_dict=True).logits
        lp_plain, _ = response_logprobs_from_logits(logits_plain, plain, 1.0)
        lp_padded, _ = response_logprobs_from_logits(logits_padded, padded, 1.0)
    np.testing.assert_allclose(lp_padded.numpy()[:2], lp_plain.numpy(), rtol=1e-5, atol=1e-6)
    assert not lp_padded.numpy()[2:].any()

    ids = paddle.to_tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 0]])
    batch = {"input_ids": ids, "attention_mask": paddle.to_tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
             "labels": paddle.to_tensor([[-100, -100, 7, 8, 2], [-100, 10, 11, 2, -100]])}
    from ppo.models.causal_lm import answer_nll

    with paddle.no_grad():
        expected, _ = answer_nll(model, batch["input_ids"], batch["attention_mask"], batch["labels"], chunk_size=0)
        firsts, (labels,) = supervised_micro_batch(batch, 4, 8, 0)
        assert firsts[0].shape == labels.shape == [4, 8] and (labels.numpy()[2:] == -100).all()
        out = model(input_ids=firsts[0], attention_mask=firsts[1].astype("int64"), position_ids=firsts[2], return_dict=True).logits
        np.testing.assert_allclose(float(answer_nll_from_logits(out, labels)), float(expected), rtol=1e-5)


def test_generation_copy_is_filled_for_the_block_and_released_after(tiny_model_dir):
    """Without a pipeline group the stages are this rank's model: the copy starts released,
    inside `gathered_into` it shares the model's tensors and gives its logits, and after the
    block its parameters hold no storage again while the model's own are untouched."""
    from ppo.strategy.pipeline.policy_pipe import gathered_into, plain_copy_of

    source = load_causal_lm(tiny_model_dir)
    source.eval()
    copy = plain_copy_of(source)
    assert copy is not source and type(copy).__name__ == type(source).__name__
    assert not any(p._is_initialized() for p in copy.parameters())
    ids = paddle.to_tensor([[3, 5, 7, 9, 11, 4]])
    with paddle.no_grad():
        expected = source(input_ids=ids, return_dict=True).logits.numpy()
        with gathered_into(copy, source) as model:
            assert model is copy and all(p._is_initialized() for p in copy.parameters())
            got = copy(input_ids=ids, return_dict=True).logits.numpy()
        np.testing.assert_array_equal(got, expected)
        assert not any(p._is_initialized() for p in copy.parameters())
        np.testing.assert_array_equal(source(input_ids=ids, return_dict=True).logits.numpy(), expected)
        with pytest.raises(Exception):  # a released copy cannot run
            copy(input_ids=ids, return_dict=True)


def test_nested_generation_blocks_gather_once(tiny_model_dir):
    """`PipelinePasses.generation_weights` inside another (the draws of dynamic sampling) reuses
    the filled copy; the copy is released when the outermost block ends."""
    from types import SimpleNamespace

    from ppo.strategy.pipeline.policy_pipe import plain_copy_of
    from ppo.strategy.pipeline.passes import PipelinePasses

    source = load_causal_lm(tiny_model_dir)
    passes = object.__new__(PipelinePasses)
    passes.models = SimpleNamespace(actor=source)
    passes.generation_model, passes.generation_filled = plain_copy_of(source), False
    filled = lambda: all(p._is_initialized() for p in passes.generation_model.parameters())  # noqa: E731
    with passes.generation_weights() as outer:
        with passes.generation_weights() as inner:
            assert inner is outer and filled()
        assert filled()  # the inner block did not release what the outer one holds
    assert not any(p._is_initialized() for p in passes.generation_model.parameters())
    with passes.generation_weights():
        assert filled()  # a later block fills it again
