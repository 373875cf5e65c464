"""Pipeline parallel 2 on our own families (`ppo/strategy/pipeline/family_pipes.py`) from a cold
`python -m paddle.distributed.launch` of two CPU processes (the test stand-ins of fleet's
pipeline collectives installed by the cold-launch site), against one process from a cold launch
too: SFT on the tiny Qwen3 (tied embeddings: the embedding on stage 0, its copy as the head on
stage 1, their gradients summed), Qwen3 with an untied head, the tiny ERNIE 4.5 (tied,
interleaved RoPE; also with full recompute), Qwen3-MoE (its one MoE layer on stage 1) and
Mixtral (every layer sparse: the router sums and their gradient cross the stages); GRPO (the
rollout engine generating from the stages gathered on every rank) on Qwen3, ERNIE 4.5,
Qwen3-MoE and Mixtral; a reward model (score-model pipe) on Qwen3; DPO (policy and reference
pipes) on Qwen3 and Mixtral; TP 2 x PP 2 SFT on a Qwen3 whose tied head is split over the
vocabulary. Loss tolerances are the Llama pipeline tests' (tests/test_pipeline_entry.py,
tests/test_pipeline_rl.py); the measured differences are in docs/family_parallel.md."""
import json
import os

import numpy as np
import pytest

from tests.test_pipeline_entry import PP_ARGS, assert_same_saved_weights, assert_same_steps, entry_argv, final_eval, sft_argv
from tests.test_tensor_parallel import assert_same_steps as assert_same_rl_steps, assert_same_weights, ppo_argv
from tests.tp_launch import cold_launch_run, read_jsonl

pytestmark = pytest.mark.slow

WEIGHT_ATOL = 3e-4
"""Saved weights of SFT, RM and DPO, as tests/test_family_tensor_parallel_launch.py's SFT: the
losses agree (mostly bit for bit) while AdamW at lr 1e-2 turns rounding on a near-zero gradient
into up to lr a step on a lone entry. Measured: DPO 1.8e-4 on one of 8,192 q_proj entries, TP 2 x
PP 2 SFT 1.3e-4, untied Qwen3 SFT 4.2e-5, RM 2.6e-5, Mixtral SFT 2.1e-5, ERNIE SFT 1.9e-5, tied
Qwen3 SFT 4.5e-6 (the weights move by 2e-2)."""
CASES = {"qwen3": ("qwen3", False), "qwen3_untied": ("qwen3", True), "ernie45": ("ernie45", False),
         "qwen3_even_vocab": ("qwen3", False), "qwen3_moe": ("qwen3_moe", False), "mixtral": ("mixtral", False)}
"""name: (arch, head untied); `even_vocab`: one more token, so that tensor parallel 2 splits the vocabulary."""
SFT_CASES = {"qwen3": (), "qwen3_untied": (), "ernie45": (), "ernie45_recompute": ("--recompute", "true"),
             "qwen3_moe": (), "mixtral": ()}
"""SFT case: its extra arguments (the model is the case's name before `_recompute`)."""


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """`case` -> its tiny two-layer model directory (one layer per stage), built once per module."""
    from tests.family_pipe_pp1_worker import build

    built = {}

    def get(case):
        if case not in built:
            arch, untied = CASES[case]
            built[case] = str(tmp_path_factory.mktemp(f"tiny_{case}"))
            build(built[case], arch, untied)
            if case.endswith("even_vocab"):
                from tests.test_family_tensor_parallel_launch import one_more_token

                one_more_token(built[case], untie=False)
        return built[case]

    return get


def launch(script, argv, out, parallel=(), nproc=1):
    return cold_launch_run(script, [*argv, *parallel, "--output_dir", out, "--logging_dir", f"{out}/vdl"], out,
                           nproc=nproc, cpu_tp_standins=nproc > 1)


def one_and_pp2(script, argv, tmp_path, parallel=PP_ARGS, nproc=2):
    return launch(script, argv, str(tmp_path / "one")), launch(script, argv, str(tmp_path / "pp2"), parallel, nproc)


@pytest.mark.parametrize("case", list(SFT_CASES))
def test_sft_pipeline_matches_one_process(case, family_dirs, tiny_data_dir, tmp_path):
    """`ernie45_recompute`: full recompute, each decoder layer of a stage run again in backward."""
    model_dir = family_dirs(case.replace("_recompute", ""))
    one, pp2 = one_and_pp2("sft/run_sft.py", [*sft_argv(model_dir, tiny_data_dir), *SFT_CASES[case]], tmp_path)
    assert_same_steps(one, pp2, "loss/sft")
    np.testing.assert_allclose(final_eval(pp2, "eval/loss"), final_eval(one, "eval/loss"), rtol=1e-5)
    assert final_eval(pp2, "eval/accuracy") == final_eval(one, "eval/accuracy")  # greedy, stages gathered
    assert_same_saved_weights(one, pp2, model_dir, atol=WEIGHT_ATOL)
    arch = json.load(open(os.path.join(model_dir, "config.json")))["architectures"]
    assert json.load(open(os.path.join(pp2, "config.json")))["architectures"] == arch


@pytest.mark.parametrize("case", ["qwen3", "ernie45", "qwen3_moe", "mixtral"])
def test_grpo_pipeline_matches_one_process(case, family_dirs, tiny_data_dir, tmp_path):
    """Rule rewards, a k3 KL loss against the reference pipe, two micro-batches per step; the
    MoE actors' router losses from the sums carried to the last stage."""
    model_dir = family_dirs(case)
    argv = ["config/tiny/grpo_rule_argument.json", *ppo_argv(
        model_dir, tiny_data_dir, "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--learning_rate", "1e-3",
        "--kl_loss_coeff", "0.05", "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer")]
    one, pp2 = one_and_pp2("ppo/run_ppo.py", argv, tmp_path)
    moe = ("moe/aux_loss", "moe/expert_load_max_over_mean") if CASES[case][0] in ("qwen3_moe", "mixtral") else ()
    for key in ("loss/policy_avg", "objective/scores", "loss/kl", "policy/entropy_avg", "train/actor_grad_norm", *moe):
        assert_same_rl_steps(one, pp2, key, 2)
    # atol 5e-5: measured 3.0e-5 on 4 of Mixtral's 6,400 embedding entries (its KL 8.7e-6 relative),
    # every other case within 5.1e-6: AdamW at lr 1e-3 on near-zero gradients
    assert_same_weights(os.path.join(one, "policy"), os.path.join(pp2, "policy"), atol=5e-5)
    responses = [[s["response"] for s in read_jsonl(f"{o}/samples.jsonl")] for o in (one, pp2)]
    assert responses[1] == responses[0] and responses[0]


def test_reward_model_pipeline_matches_one_process(family_dirs, tiny_data_dir, tmp_path):
    from tests.conftest import save_score_model

    rm_dir = save_score_model(family_dirs("qwen3"), str(tmp_path / "rm"))
    argv = entry_argv("config/tiny/rm_argument.json", rm_dir, f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl",
                      f"PKU-SafeRLHF/test:0.9:{tiny_data_dir}/preference_eval.jsonl")
    one, pp2 = one_and_pp2("rm/run_reward.py", argv, tmp_path)
    assert_same_rl_steps(one, pp2, "rm/loss", 3)  # (its loss need not fall in 3 steps)
    for key in ("rm/accuracy", "rm/eval_loss"):
        np.testing.assert_allclose(final_eval(pp2, key), final_eval(one, key), rtol=1e-4, atol=1e-6, err_msg=key)
    assert_same_saved_weights(one, pp2, rm_dir, atol=WEIGHT_ATOL)
    assert json.load(open(os.path.join(pp2, "config.json")))["architectures"] == ["Qwen3ModelForScore"]


@pytest.mark.parametrize("case", ["qwen3", "mixtral"])
def test_dpo_pipeline_matches_one_process(case, family_dirs, tiny_data_dir, tmp_path):
    """Mixtral: the policy's router losses join the preference loss on the last stage and its
    `moe/*` statistics the logged ones."""
    model_dir = family_dirs(case)
    argv = entry_argv("config/tiny/dpo_argument.json", model_dir, f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl",
                      f"PKU-SafeRLHF/test:0.9:{tiny_data_dir}/preference_eval.jsonl", "--loss_type", "sigmoid",
                      "--eval_generation_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--eval_max_new_tokens", "6")
    one, pp2 = one_and_pp2("dpo/run_dpo.py", argv, tmp_path)
    assert_same_steps(one, pp2, "loss/total")
    if case == "mixtral":
        assert_same_rl_steps(one, pp2, "moe/aux_loss", 3)
    for key in ("eval/loss", "eval/preference_accuracy"):
        np.testing.assert_allclose(final_eval(pp2, key), final_eval(one, key), rtol=1e-4, atol=1e-6, err_msg=key)
    assert final_eval(pp2, "eval/accuracy") == final_eval(one, "eval/accuracy")  # generation, stages gathered
    assert_same_saved_weights(one, pp2, model_dir, atol=WEIGHT_ATOL)


def test_sft_tensor_and_pipeline_parallel_matches_one_process(family_dirs, tiny_data_dir, tmp_path):
    """TP 2 x PP 2 on four processes: each stage split over two tensor-parallel ranks, the tied
    head's copy on stage 1 split over the vocabulary like the embedding on stage 0; the generation
    copy and the saved checkpoint merge the slices."""
    model_dir = family_dirs("qwen3_even_vocab")
    one, pp2 = one_and_pp2("sft/run_sft.py", sft_argv(model_dir, tiny_data_dir), tmp_path,
                           (*PP_ARGS, "--tensor_parallel_degree", "2"), 4)
    assert_same_steps(one, pp2, "loss/sft")
    np.testing.assert_allclose(final_eval(pp2, "eval/loss"), final_eval(one, "eval/loss"), rtol=1e-5)
    assert final_eval(pp2, "eval/accuracy") == final_eval(one, "eval/accuracy")
    assert_same_saved_weights(one, pp2, model_dir, atol=WEIGHT_ATOL)
    assert json.load(open(os.path.join(pp2, "config.json"))).get("tensor_parallel_degree", 1) == 1
