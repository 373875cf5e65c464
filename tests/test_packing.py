"""Packed supervised batches (`zero_padding`): the packing plan, the block-diagonal causal mask,
and the same answer-token loss and gradients as the padded batch of the same samples."""
import numpy as np
import paddle
import pytest

from ppo.data.packing import PackedSupervisedCollator, block_causal_mask, pack_rows
from ppo.data.supervised import SupervisedCollator
from ppo.models.causal_lm import answer_nll
from ppo.models.loading import load_causal_lm
from ppo.models.train_patch import patch_overrides


def test_first_fit_decreasing_plan():
    """Lengths 5, 9, 3, 4, 2 into rows of 10: 9 first (row 0, room 1), 5 (row 1, room 5),
    4 (row 1, room 1), 3 (row 2, room 7), 2 (row 2, room 5)."""
    assert pack_rows([5, 9, 3, 4, 2], 10) == [[1], [0, 3], [2, 4]]
    rows = pack_rows([7, 1, 8, 2, 6, 3, 3], 9)
    assert sorted(i for r in rows for i in r) == list(range(7))
    assert all(sum([7, 1, 8, 2, 6, 3, 3][i] for i in r) <= 9 for r in rows) and len(rows) == 4
    with pytest.raises(ValueError, match="sample 1 has 12 tokens"):
        pack_rows([3, 12], 10)


def test_block_causal_mask_hand_case():
    """Row [a0 a1 b0 pad]: a1 sees a0 and itself, b0 only itself, pad only itself."""
    mask = block_causal_mask(np.array([[0, 0, 1, -1]]))[0, 0]
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=bool)
    np.testing.assert_array_equal(mask, expected)


def samples(rng, lengths, vocab):
    out = []
    for n in lengths:
        ids = rng.integers(3, vocab, size=n)
        prompt = rng.integers(1, n)
        out.append({"input_ids": ids.astype("int64"), "labels": np.where(np.arange(n) < prompt, -100, ids).astype("int64")})
    return out


def test_packed_collator_layout():
    """Lengths 6, 3, 4 into rows of 10: the 6 and the 4 share row 0, the 3 takes row 1."""
    batch = PackedSupervisedCollator(0, max_length=10, return_tensors="np")(samples(np.random.default_rng(0), [6, 3, 4], 50))
    assert batch["input_ids"].shape == (2, 10) and batch["attention_mask"].shape == (2, 1, 10, 10)
    np.testing.assert_array_equal(batch["position_ids"][0], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3])
    np.testing.assert_array_equal(batch["position_ids"][1], [0, 1, 2, 0, 0, 0, 0, 0, 0, 0])  # the 3, then pad
    assert batch["labels"][0, 6] == -100 and (batch["labels"][1, 3:] == -100).all()  # first tokens and pad
    assert batch["attention_mask"][0, 0, 7, 5] == 0 and batch["attention_mask"][0, 0, 7, 6] == 1


def loss_and_grads(model, batch):
    model.clear_gradients()
    loss, _ = answer_nll(model, batch["input_ids"], batch["attention_mask"], batch["labels"], chunk_size=16,
                         position_ids=batch.get("position_ids"))
    loss.backward()
    return float(loss), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("use_train_patch", [True, False])
def test_packed_batch_gives_the_padded_loss_and_gradients(tiny_model_dir, use_train_patch):
    """With PaddleNLP's attention and with the train patch's fused attention (4-D mask)."""
    patch_overrides(use_train_patch)
    model = load_causal_lm(tiny_model_dir)
    model.train()
    vocab = model.config.vocab_size
    items = samples(np.random.default_rng(1), [11, 3, 7, 5, 9, 2], vocab)
    padded = SupervisedCollator(0)(items)
    packed = PackedSupervisedCollator(0, max_length=16)(items)
    assert packed["input_ids"].shape[0] < padded["input_ids"].shape[0]  # fewer rows: pad tokens saved
    loss_pad, grads_pad = loss_and_grads(model, padded)
    loss_pack, grads_pack = loss_and_grads(model, packed)
    np.testing.assert_allclose(loss_pack, loss_pad, rtol=1e-5)
    assert sorted(grads_pad) == sorted(grads_pack)
    for name in grads_pad:
        np.testing.assert_allclose(grads_pack[name], grads_pad[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_sft_with_zero_padding_trains_like_padding(tiny_model_dir, tiny_data_dir, tmp_path):
    """The entry script with `zero_padding true` (the PaddleNLP key) logs the padded run's
    losses and saves its weights (float rounding apart)."""
    import json

    from sft.run_sft import main as run_sft

    def run(name, *extra):
        out = str(tmp_path / name)
        run_sft(["config/tiny/sft_argument.json", "--model_name_or_path", tiny_model_dir,
                 "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl", "--eval_datasets", "",
                 "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "4", "--logging_steps", "1",
                 "--per_device_train_batch_size", "8", "--save_steps", "4", "--warmup_steps", "0",
                 "--overwrite_output_dir", "true", "--disable_tqdm", "true", *extra])
        losses = [r["loss/sft"] for r in map(json.loads, open(f"{out}/metrics.jsonl")) if "loss/sft" in r]
        return losses, {k: v.numpy() for k, v in paddle.load(f"{out}/model_state.pdparams").items()}

    padded_losses, padded = run("padded")
    packed_losses, packed = run("packed", "--zero_padding", "true")
    assert len(packed_losses) == 4
    np.testing.assert_allclose(packed_losses, padded_losses, rtol=1e-5)
    for key in padded:
        np.testing.assert_allclose(packed[key], padded[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_place_samples_gives_rows_and_columns():
    """Lengths 6, 3, 4 into rows of 10 (the layout above): 6 at row 0 column 0, 4 after it, 3 alone."""
    from ppo.data.packing import place_samples

    rows, row_of, start, width = place_samples([6, 3, 4], 10)
    assert rows == [[0, 2], [1]] and width == 10
    np.testing.assert_array_equal(row_of, [0, 1, 0])
    np.testing.assert_array_equal(start, [0, 0, 6])
