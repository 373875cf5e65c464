"""PaddleNLP's Qwen2-MoE and Mixtral, mended by `bench/paddlenlp_moe_compat.py`, compute what our
classes compute from the same checkpoint, and their `generate` gives the rollout engine's greedy
tokens: the baseline of `bench/rollout_bench.py --config moe` is a fair one."""
import numpy as np
import paddle
import pytest

from bench.rollout_bench import load_models, make_prompts
from ppo.rollout import RolloutEngine, SamplingParams

SMALL = {
    "qwen2_moe": dict(family="qwen2_moe", hidden_size=64, num_layers=2, num_heads=4, num_experts=4, top_k=2,
                      expert_size=32, shared_expert_size=64),
    "mixtral": dict(family="mixtral", hidden_size=64, num_layers=2, num_heads=4, num_experts=4, top_k=2, expert_size=64),
}


@pytest.mark.parametrize("family", sorted(SMALL))
def test_mended_paddlenlp_forward_and_generate_match_ours(family):
    baseline, ours, generate_kwargs = load_models(family, SMALL[family])
    assert type(baseline).__module__.startswith("paddlenlp.transformers.")
    assert type(ours).__module__.startswith("ppo.models.families.")
    ids, mask = make_prompts(4, 12)
    with paddle.no_grad():
        theirs = baseline(ids, attention_mask=mask, output_router_logits=False, return_dict=True).logits
        mine = ours(ids, attention_mask=mask, return_dict=True).logits
        keep = mask.numpy().astype(bool)  # left-padded positions are not compared
        diff = np.abs(theirs.numpy() - mine.numpy())[keep]
        assert diff.max() < 1e-5, diff.max()
        ref = baseline.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, decode_strategy="greedy_search",
                                eos_token_id=2, pad_token_id=3, **generate_kwargs)[0].numpy()
    out = RolloutEngine(ours, eos_token_id=2, pad_token_id=3).generate(
        ids, mask, SamplingParams(max_new_tokens=8, min_new_tokens=0, do_sample=False))
    got, lengths = out.response_ids.numpy(), out.response_lengths.numpy()
    assert ref.shape == (4, 8)
    for row in range(4):
        np.testing.assert_array_equal(got[row, :lengths[row]], ref[row, :lengths[row]])
