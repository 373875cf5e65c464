"""Tensor parallel 2 on our own families from a cold `python -m paddle.distributed.launch` (two CPU
processes, the test stand-ins of the model-parallel collectives installed by the cold-launch
site), against one process from a cold launch too: SFT and GRPO on the tiny Qwen3 (tied
embeddings, a vocabulary of 109 that 2 does not divide: embedding and head whole on each rank),
Qwen3 with 110 tokens and an untied head (vocabulary-parallel embedding, head ``[H, V / 2]``,
log-probs over the split vocabulary), Qwen3-MoE with 110 tokens (tied vocabulary-parallel head,
experts split along their width, router replicated, the load-balancing loss on: every rank
sees every token, so it is the one-process loss), ERNIE 4.5 dense and ERNIE 4.5 MoE (16 heads, 2 KV heads,
interleaved RoPE, a shared expert), Qwen2-MoE (q/k/v biases, a gated shared expert) and Mixtral
(every layer sparse); a reward model and LoRA SFT on Qwen3-MoE. Both ranks read the same batches, so the batch sizes are
the one-process run's. The saved models are the one-process layout.

Measured against one process: SFT losses within 1.3e-7 relative (often equal), eval loss and
accuracy equal, weights within 1.9e-4 (three steps of AdamW at learning rate 1e-2 turn rounding on
near-zero gradients into up to 2e-4 on a few entries; most tensors within 2e-5); GRPO losses,
KL, entropy and gradient norm within 1.7e-6 relative (Mixtral's KL 4.4e-6), the same sampled
responses, weights within 1.7e-5; a reward model on Qwen3-MoE: losses equal, weights within
6.4e-5; LoRA SFT: losses within 1.1e-7, adapter weights within 1.6e-5. Before the q/k norm weights entered through the model-parallel identity (their
gradient is a partial sum over a rank's heads) Qwen3's SFT weights were 3.7e-2 apart."""
import json
import os

import numpy as np
import paddle
import pytest

from tests.test_expert_parallel_launch import grpo_argv, sft_argv
from tests.test_tensor_parallel import saved_weights
from tests.tp_launch import cold_launch_run, read_jsonl, step_values

pytestmark = pytest.mark.slow

LOSS_RTOL = 1e-5
SFT_WEIGHT_ATOL = 3e-4
GRPO_WEIGHT_ATOL = 2.5e-5
RM_WEIGHT_ATOL = 5e-4  # measured 3.3e-4 (one expert element of 4,096) after the router loss joined the reward
# model's loss: AdamW at lr 1e-2 moves an element whose gradient is rounding-sized by up to lr per step
GRPO_KEYS = ("loss/policy_avg", "loss/kl", "objective/scores", "policy/entropy_avg", "train/actor_grad_norm")
CASES = {  # name: (arch, num_heads, vocabulary made even, head untied)
    "qwen3": ("qwen3", 4, False, False),
    "qwen3_untied_even_vocab": ("qwen3", 4, True, True),
    "qwen3_moe_even_vocab": ("qwen3_moe", 4, True, False),
    "ernie45": ("ernie45", 16, False, False),
    "ernie45_moe": ("ernie45_moe", 16, False, False),
    "qwen2_moe": ("qwen2_moe", 4, False, False),
    "mixtral": ("mixtral", 4, False, False),
}


RECOMPUTE = ("qwen3_moe_even_vocab",)
"""Cases whose SFT runs with full activation recompute (the layers' collectives run again in backward)."""


def one_more_token(path, untie):
    """The model in `path` with a vocabulary one row larger (even: split over 2 ranks), the
    head untied (a scaled copy of the embedding, ``[H, V]``) with `untie`."""
    config_file, weights_file = os.path.join(path, "config.json"), os.path.join(path, "model_state.pdparams")
    config, weights = json.load(open(config_file)), paddle.load(weights_file)
    key = next(k for k in weights if k.endswith("embed_tokens.weight"))
    rows = weights[key].numpy()
    rows = np.concatenate([rows, np.random.default_rng(0).normal(0, 0.02, (1, rows.shape[1])).astype(rows.dtype)])
    weights[key] = paddle.to_tensor(rows)
    weights["lm_head.weight"] = paddle.to_tensor(np.ascontiguousarray(rows.T) * 1.5 if untie else rows)
    config.update(vocab_size=rows.shape[0], tie_word_embeddings=not untie and config["tie_word_embeddings"])
    json.dump(config, open(config_file, "w"), indent=2)
    paddle.save(weights, weights_file)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """`case` -> its tiny model directory, built once per module."""
    from ppo.tiny.factory import build_tiny

    built = {}

    def get(case):
        if case not in built:
            arch, heads, even, untie = CASES[case]
            path = str(tmp_path_factory.mktemp(f"tiny_{case}"))
            build_tiny(path, seed=5, hidden_size=64, num_layers=2, num_heads=heads, intermediate_size=128, arch=arch)
            if even:
                one_more_token(path, untie)
            built[case] = path
        return built[case]

    return get


def launch(script, argv, out, tensor_parallel):
    tp = ["--tensor_parallel_degree", "2"] if tensor_parallel else []
    return cold_launch_run(script, [*argv, *tp, "--output_dir", out, "--logging_dir", f"{out}/vdl"], out,
                           nproc=2 if tensor_parallel else 1, cpu_tp_standins=tensor_parallel)


def assert_same_run(one, tp2, keys, steps, weights_sub, atol):
    for key in keys:
        v1, v2 = step_values(one, key), step_values(tp2, key)
        assert sorted(v1) == sorted(v2) == list(range(1, steps + 1)), (key, v1, v2)
        np.testing.assert_allclose([v2[s] for s in v1], [v1[s] for s in v1], rtol=LOSS_RTOL, atol=1e-9, err_msg=key)
    a, b = saved_weights(os.path.join(one, weights_sub)), saved_weights(os.path.join(tp2, weights_sub))
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].shape == b[key].shape, key  # merged back to whole tensors
        np.testing.assert_allclose(b[key], a[key], atol=atol, rtol=0, err_msg=key)
    config = json.load(open(os.path.join(tp2, weights_sub, "config.json")))
    assert config.get("tensor_parallel_degree", 1) == 1


@pytest.mark.parametrize("case", list(CASES))
def test_sft_tensor_parallel_matches_one_process(case, family_dirs, tiny_data_dir, tmp_path):
    argv = [*sft_argv(family_dirs(case), tiny_data_dir), "--per_device_train_batch_size", "8",
            "--recompute", "true" if case in RECOMPUTE else "false"]
    one = launch("sft/run_sft.py", argv, str(tmp_path / "one"), False)
    tp2 = launch("sft/run_sft.py", argv, str(tmp_path / "tp2"), True)
    assert_same_run(one, tp2, ("loss/sft",), 3, "", SFT_WEIGHT_ATOL)
    s1, s2 = (json.load(open(f"{o}/summary.json"))["final_eval"] for o in (one, tp2))
    np.testing.assert_allclose(s2["eval/loss"], s1["eval/loss"], rtol=LOSS_RTOL)
    assert s2["eval/accuracy"] == s1["eval/accuracy"]  # greedy generation from the gathered weights


@pytest.mark.parametrize("case", list(CASES))
def test_grpo_tensor_parallel_matches_one_process(case, family_dirs, tiny_data_dir, tmp_path):
    """The rollout engine generates from the gathered weights (experts too) on both ranks; the
    log-prob passes run on the split model (over the split vocabulary where it is split)."""
    argv = grpo_argv(family_dirs(case), tiny_data_dir, "--per_device_prompt_batch_size", "4",
                     "--per_device_train_batch_size", "16")
    one = launch("ppo/run_ppo.py", argv, str(tmp_path / "one"), False)
    tp2 = launch("ppo/run_ppo.py", argv, str(tmp_path / "tp2"), True)
    keys = GRPO_KEYS + (("moe/aux_loss",) if "moe" in case else ())
    assert_same_run(one, tp2, keys, 2, "policy", GRPO_WEIGHT_ATOL)
    responses = [[r["response"] for r in read_jsonl(f"{o}/samples.jsonl")] for o in (one, tp2)]
    assert responses[1] == responses[0] and responses[0]


@pytest.mark.parametrize("case", ["qwen3_moe_even_vocab"])
def test_reward_model_tensor_parallel_matches_one_process(case, family_dirs, tiny_data_dir, tmp_path):
    """A score model on the family's backbone: the backbone split, the score head replicated."""
    from tests.conftest import save_score_model

    rm_dir = save_score_model(family_dirs(case), str(tmp_path / "rm"))
    argv = ["config/tiny/rm_argument.json", "--model_name_or_path", rm_dir,
            "--train_datasets", f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl",
            "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{tiny_data_dir}/preference_eval.jsonl",
            "--max_steps", "3", "--per_device_train_batch_size", "16", "--logging_steps", "1", "--learning_rate", "1e-2",
            "--eval_steps", "3", "--save_steps", "3", "--warmup_steps", "0", "--disable_tqdm", "true"]
    one = launch("rm/run_reward.py", argv, str(tmp_path / "one"), False)
    tp2 = launch("rm/run_reward.py", argv, str(tmp_path / "tp2"), True)
    assert_same_run(one, tp2, ("rm/loss",), 3, "", RM_WEIGHT_ATOL)
    assert "score_head.weight" in saved_weights(tp2)


def test_sft_lora_tensor_parallel_matches_one_process(family_dirs, tiny_data_dir, tmp_path):
    """LoRA on Qwen3-MoE's default targets (attention and every expert): PaddleNLP's column / row
    parallel LoRA layers wrap our split projections; the saved adapter is merged to full shapes."""
    from ppo.models.loading import apply_lora, load_causal_lm, load_tokenizer

    base = family_dirs("qwen3_moe_even_vocab")
    lora_dir = str(tmp_path / "lora")
    paddle.seed(7)  # both runs start from this adapter (a fresh one drawn per layout would differ)
    apply_lora(load_causal_lm(base), base_model_name_or_path=base).save_pretrained(lora_dir)
    load_tokenizer(base).save_pretrained(lora_dir)
    argv = [*sft_argv(lora_dir, tiny_data_dir), "--per_device_train_batch_size", "8", "--eval_datasets", "",
            "--evaluation_strategy", "no", "--do_eval", "false"]
    one = launch("sft/run_sft.py", argv, str(tmp_path / "one"), False)
    tp2 = launch("sft/run_sft.py", argv, str(tmp_path / "tp2"), True)
    v1, v2 = step_values(one, "loss/sft"), step_values(tp2, "loss/sft")
    assert sorted(v1) == sorted(v2) == [1, 2, 3]
    np.testing.assert_allclose([v2[s] for s in v1], [v1[s] for s in v1], rtol=LOSS_RTOL, atol=1e-9)
    a, b = (paddle.load(os.path.join(o, "lora_model_state.pdparams")) for o in (one, tp2))
    assert sorted(a) == sorted(b) and any("experts.3." in k for k in a)
    for key in a:
        assert a[key].shape == b[key].shape, key
        np.testing.assert_allclose(b[key].numpy(), a[key].numpy(), atol=SFT_WEIGHT_ATOL, rtol=0, err_msg=key)
    start = paddle.load(os.path.join(lora_dir, "lora_model_state.pdparams"))
    assert any(not np.allclose(start[k].numpy(), b[k].numpy()) for k in b)
