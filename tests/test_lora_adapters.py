"""LoRA adapters downstream: a score-model adapter from rm/run_reward.py (LoRA matrices, trained
score head, normaliser statistics) loads as reward model and critic, chains of adapters over one
base directory load merged, and sft/merge_lora.py merges either kind into a full directory."""
import json
import os

import numpy as np
import paddle
import pytest

from ppo.common.validation import check_model_dir
from ppo.models.adapters import adapter_chain, load_merged_causal_lm, load_merged_score_model, load_score_model
from ppo.models.loading import is_lora_model, load_causal_lm
from ppo.models.score_model import AutoModelForScore
from sft.merge_lora import main as merge_lora_main

PROBE = [[1, 4, 7, 30, 31, 2], [1, 5, 9, 40, 41, 2]]


def run_lora_sft(model_dir, data_dir, out):
    from sft.run_sft import main as run_sft

    run_sft([
        "config/tiny/sft_argument.json", "--model_name_or_path", model_dir,
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/sft.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--use_lora", "true", "--lora_rank", "4",
        "--max_steps", "10", "--per_device_train_batch_size", "32", "--learning_rate", "1e-2", "--logging_steps", "5",
        "--evaluation_strategy", "no", "--do_eval", "false", "--save_steps", "10", "--warmup_steps", "1", "--disable_tqdm", "true",
    ])
    return out


def run_lora_rm(start_dir, data_dir, out):
    from rm.run_reward import main as run_reward

    run_reward([
        "config/tiny/rm_argument.json", "--model_name_or_path", start_dir,
        "--train_datasets", f"PKU-SafeRLHF/train:1.0:{data_dir}/preference.jsonl",
        "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{data_dir}/preference_eval.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--use_lora", "true", "--lora_rank", "4",
        "--max_steps", "10", "--per_device_train_batch_size", "32", "--learning_rate", "1e-2", "--logging_steps", "5",
        "--evaluation_strategy", "no", "--save_steps", "10", "--warmup_steps", "1", "--disable_tqdm", "true",
    ])
    return out


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """SFT adapter on the base, reward adapter on the SFT adapter: one full model on disk."""
    root = tmp_path_factory.mktemp("adapters")
    sft = run_lora_sft(tiny_model_dir, tiny_data_dir, str(root / "sft"))
    rm = run_lora_rm(sft, tiny_data_dir, str(root / "rm"))
    return {"base": tiny_model_dir, "sft": sft, "rm": rm}


def end_scores(model, ids=PROBE):
    model.eval()
    ids = paddle.to_tensor(ids)
    return model(ids, attention_mask=paddle.ones_like(ids)).end_scores.numpy()


def test_reward_adapter_saves_head_and_normaliser(adapters):
    rm = adapters["rm"]
    state = paddle.load(os.path.join(rm, "lora_model_state.pdparams"))
    assert "score_head.weight" in state and any("lora_B" in k for k in state)
    assert not any(k.startswith("llama.") and "lora" not in k for k in state)  # no base weights in the adapter
    assert json.load(open(os.path.join(rm, "config.json")))["score_type"] == "reward"
    stats = json.load(open(os.path.join(rm, "score_normalizer.json")))
    assert stats["count"] == 10 * 32 * 2  # every scored sequence of 10 steps of 32 pairs
    assert adapter_chain(rm) == (adapters["base"], [adapters["sft"], rm])
    untrained = AutoModelForScore.from_pretrained(adapters["base"])
    assert not np.allclose(state["score_head.weight"].numpy(), untrained.score_head.weight.numpy())
    check_model_dir("reward_model_name_or_path", rm, need_score_head=True)


def test_score_adapter_loads_merged_with_the_same_scores(adapters):
    lora = load_score_model(adapters["rm"])
    assert is_lora_model(lora)
    merged = load_merged_score_model(adapters["rm"])
    assert not is_lora_model(merged) and merged.config.normalizer_type == "RunningMeanStd"
    np.testing.assert_allclose(end_scores(merged), end_scores(lora), atol=1e-5)
    stats = json.load(open(os.path.join(adapters["rm"], "score_normalizer.json")))
    assert float(merged.normalizer_count) == stats["count"] and float(merged.normalizer_mean) == pytest.approx(stats["mean"])
    critic = load_merged_score_model(adapters["rm"], score_type="critic", do_normalize=False, normalizer_type=None)
    assert critic.config.score_type == "critic"
    np.testing.assert_array_equal(critic.score_head.weight.numpy(), merged.score_head.weight.numpy())


def test_merge_tool_writes_full_score_and_causal_models(adapters, tmp_path):
    merge_lora_main(["--lora_path", adapters["rm"], "--output_dir", str(tmp_path / "rm_merged")])
    full = AutoModelForScore.from_pretrained(str(tmp_path / "rm_merged"))
    assert full.config.score_type == "reward"
    np.testing.assert_allclose(end_scores(full), end_scores(load_merged_score_model(adapters["rm"])), atol=1e-5)
    np.testing.assert_array_equal(full.normalizer_count.numpy(), load_merged_score_model(adapters["rm"]).normalizer_count.numpy())
    assert os.path.isfile(tmp_path / "rm_merged" / "tokenizer_config.json")
    check_model_dir("reward_model_name_or_path", str(tmp_path / "rm_merged"), need_score_head=True)

    merge_lora_main(["--lora_path", adapters["sft"], "--output_dir", str(tmp_path / "sft_merged")])
    from paddlenlp.transformers import AutoModelForCausalLM

    causal = AutoModelForCausalLM.from_pretrained(str(tmp_path / "sft_merged"))
    causal.eval()
    sft = load_causal_lm(adapters["sft"])
    sft.eval()
    ids = paddle.to_tensor(PROBE)
    np.testing.assert_allclose(causal(ids)[0].numpy(), sft(ids)[0].numpy(), atol=1e-5)


def test_causal_adapter_is_refused_as_reward_model(adapters):
    with pytest.raises(ValueError, match="without a trained score head"):
        check_model_dir("reward_model_name_or_path", adapters["sft"], need_score_head=True)


def test_adapter_chain_refused_under_tensor_parallel(adapters):
    with pytest.raises(ValueError, match="sft/merge_lora.py"):
        load_merged_score_model(adapters["rm"], tensor_parallel_degree=2, tensor_parallel_rank=0)


def test_ppo_models_from_adapters(adapters):
    from ppo.models.ppo_models import build_ppo_models
    from ppo.entry.ppo_arguments import ModelArgument

    args = ModelArgument(actor_model_name_or_path=adapters["sft"], reward_model_name_or_path=adapters["rm"], use_lora=True,
                         lora_rank=4)
    models = build_ppo_models(args, use_critic=True)
    assert models.reference is None and is_lora_model(models.actor) and is_lora_model(models.critic)
    assert not is_lora_model(models.reward)
    trainable = [n for n, p in models.critic.named_parameters() if not p.stop_gradient]
    assert any("score_head" in n for n in trainable) and all("lora" in n or "score_head" in n for n in trainable)
    sft = load_merged_causal_lm(adapters["sft"])
    sft.eval()
    ids = paddle.to_tensor(PROBE)
    with models.reference_mode() as reference:  # the reference is the SFT model: the new adapter off
        reference.eval()
        np.testing.assert_allclose(reference(ids)[0].numpy(), sft(ids)[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(end_scores(models.critic), end_scores(models.reward), atol=1e-5)  # fresh adapter: B = 0


def test_merged_model_is_plain_and_trainable(adapters):
    merged = load_merged_causal_lm(adapters["sft"])
    names = [n for n, _ in merged.named_parameters()]
    assert not any("lora" in n for n in names) and not any(n.endswith("proj.bias") for n in names)  # no biases added
    assert all(not p.stop_gradient for p in merged.parameters())


def test_whole_weight_training_refused_with_the_adapter_off_reference(adapters):
    from ppo.models.ppo_models import build_ppo_models
    from ppo.entry.ppo_arguments import ModelArgument

    args = ModelArgument(actor_model_name_or_path=adapters["sft"], reward_model_name_or_path=adapters["rm"], use_lora=True,
                         lora_rank=4, lora_trainable_modules="lm_head.*")
    assert args.lora_settings()["trainable_modules"] == ["lm_head.*"]
    with pytest.raises(ValueError, match=r"also trains whole weights \['lm_head.\*'\].*would move the reference too"):
        build_ppo_models(args, use_critic=False)


def test_adapter_reward_model_refused_under_pipeline_parallel(adapters):
    from ppo.entry.ppo_arguments import ModelArgument
    from ppo.strategy import PipelineStrategy

    args = ModelArgument(actor_model_name_or_path=adapters["base"], reward_model_name_or_path=adapters["rm"])
    with pytest.raises(ValueError, match=r"reward_model_name_or_path=.*pipeline_parallel_degree > 1 .*sft/merge_lora.py"):
        PipelineStrategy().load_models(args, use_critic=True)


def test_adapters_naming_each_other_are_refused_before_loading(adapters, tmp_path):
    import shutil

    loop = [str(tmp_path / "a"), str(tmp_path / "b")]
    for this, other in zip(loop, loop[::-1]):
        shutil.copytree(adapters["sft"], this)
        config = json.load(open(os.path.join(this, "lora_config.json")))
        config["base_model_name_or_path"] = other
        json.dump(config, open(os.path.join(this, "lora_config.json"), "w"))
    with pytest.raises(ValueError, match="name each other as base_model_name_or_path in a loop"):
        check_model_dir("actor_model_name_or_path", loop[0])
    with pytest.raises(ValueError, match="in a loop"):
        adapter_chain(loop[0])


def test_lora_dpo_on_the_sft_adapter_has_the_sft_model_as_reference(adapters, tiny_data_dir, tmp_path):
    from dpo.run_dpo import DPOTrainingArguments, build_trainer, start_up
    from ppo.models.loading import lora_disabled

    argv = ["config/tiny/dpo_argument.json", "--model_name_or_path", adapters["sft"], "--use_lora", "true", "--lora_rank", "4",
            "--train_datasets", f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl", "--eval_datasets", "",
            "--eval_generation_datasets", "",
            "--output_dir", str(tmp_path / "dpo"), "--logging_dir", str(tmp_path / "dpo" / "vdl")]
    trainer = build_trainer(*start_up(argv, DPOTrainingArguments))
    sft = load_merged_causal_lm(adapters["sft"])
    sft.eval()
    ids = paddle.to_tensor(PROBE)
    with paddle.no_grad(), lora_disabled(trainer.model) as reference:
        reference.eval()
        np.testing.assert_allclose(reference(ids)[0].numpy(), sft(ids)[0].numpy(), atol=1e-5)
    assert all("lora" in n for n, p in trainer.model.named_parameters() if not p.stop_gradient)
