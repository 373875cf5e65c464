"""Start-up validation: bad sizes and model directories fail before any model is loaded,
with errors naming our argument and the path."""
import json
import os
import shutil

import pytest

from ppo.common.validation import check_model_dir, size_problems, weights_problem
from ppo.models.score_model import AutoModelForScore
from tests.demo_config_flags import PPO_AS_BEFORE


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def never_load(monkeypatch):
    """Make any model load fail loudly: validation must reject the run before one happens."""
    import ppo.models.loading as loading
    from paddlenlp.transformers import AutoModelForCausalLM

    def boom(*a, **k):
        raise AssertionError("a model was loaded before validation rejected the arguments")

    monkeypatch.setattr(loading, "load_causal_lm", boom)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(AutoModelForScore, "from_pretrained", boom)


class Args:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_size_problems_names_every_bad_argument():
    """PaddleNLP's fields by their table (any object holding them), ours by their declarations."""
    from ppo.entry.argument_groups import DivergenceArguments, RolloutArguments
    from ppo.entry.ppo_arguments import ModelArgument

    assert size_problems(Args(per_device_train_batch_size=1, save_total_limit=None),
                         RolloutArguments(rollout_n=2, min_dec_len=0)) == []
    problems = size_problems(Args(per_device_train_batch_size=-1, gradient_accumulation_steps=0),
                             RolloutArguments(rollout_n=0, max_dec_len=0))
    assert problems == ["per_device_train_batch_size=-1 (must be an integer >= 1)", "gradient_accumulation_steps=0 (must be an integer >= 1)",
                        "rollout_n=0 (must be an integer >= 1)", "max_dec_len=0 (must be an integer >= 1)"]
    assert size_problems(ModelArgument(reward_server_timeout=0), DivergenceArguments(divergence_factor=1.0)) == [
        "reward_server_timeout=0 (must be > 0)", "divergence_factor=1.0 (must be > 1)"]
    assert size_problems(Args(rollout_n=0)) == []  # a field of ours is bounded by its declaration, not by its name


def ppo_argv(model, rm, data, out, *extra):
    return ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, "--actor_model_name_or_path", model, "--reward_model_name_or_path", rm,
            "--train_datasets", f"Jsonfile:1.0:{data}/prompts.jsonl", "--output_dir", out,
            "--per_device_prompt_batch_size", "8", "--per_device_train_batch_size", "4", *extra]


@pytest.mark.parametrize(
    "flag,value",
    [("per_device_train_batch_size", "-1"), ("per_device_train_batch_size", "0"), ("gradient_accumulation_steps", "0"),
     ("rollout_n", "0"), ("per_device_prompt_batch_size", "0"), ("max_dec_len", "0"), ("per_device_eval_batch_size", "0")],
)
def test_ppo_refuses_bad_sizes_before_loading(flag, value, tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path, monkeypatch):
    from ppo.run_ppo import build_trainer

    never_load(monkeypatch)
    with pytest.raises(ValueError, match=rf"{flag}={value} \(must be an integer >= 1\)"):
        build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, str(tmp_path / "o"), f"--{flag}", value))


def test_missing_and_broken_model_dirs_name_argument_and_path(tiny_model_dir, tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(ValueError, match=rf"actor_model_name_or_path={missing}: no such directory"):
        check_model_dir("actor_model_name_or_path", missing)
    check_model_dir("model_name_or_path", "some-org/some-hub-model")  # a hub id is left to PaddleNLP

    empty = copy_model(tiny_model_dir, tmp_path / "empty")
    open(os.path.join(empty, "model_state.pdparams"), "wb").close()
    with pytest.raises(ValueError, match=r"model_name_or_path: weight file .*empty/model_state.pdparams is empty"):
        check_model_dir("model_name_or_path", empty)

    cut = copy_model(tiny_model_dir, tmp_path / "cut")
    file = os.path.join(cut, "model_state.pdparams")
    data = open(file, "rb").read()
    open(file, "wb").write(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut/model_state.pdparams is cut short"):
        check_model_dir("model_name_or_path", cut)

    no_weights = copy_model(tiny_model_dir, tmp_path / "noweights")
    os.remove(os.path.join(no_weights, "model_state.pdparams"))
    with pytest.raises(ValueError, match=r"noweights: no model weights"):
        check_model_dir("model_name_or_path", no_weights)
    check_model_dir("model_name_or_path", tiny_model_dir)


def test_safetensors_truncation_is_detected(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    blob = len(header).to_bytes(8, "little") + header + b"\0" * 16
    good, cut = tmp_path / "good.safetensors", tmp_path / "cut.safetensors"
    good.write_bytes(blob)
    cut.write_bytes(blob[:-4])
    assert weights_problem(str(good)) is None
    assert "cut short" in weights_problem(str(cut))


def test_lora_dir_with_missing_base_names_the_config(tmp_path):
    lora = tmp_path / "lora"
    lora.mkdir()
    (lora / "lora_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    (lora / "lora_model_state.pdparams").write_bytes(open(__file__, "rb").read()[:0] + b"\x80\x04N.")
    with pytest.raises(ValueError, match=r"LoRA base model named in .*lora_config.json\)=.*gone: no such directory"):
        check_model_dir("model_name_or_path", str(lora))


def test_causal_lm_as_reward_model_is_refused(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path, monkeypatch):
    """Finding 5: a causal LM would get a randomly initialised score head and the run would exit 0."""
    from ppo.run_ppo import build_trainer
    from rm.audit_reward import main as audit_main

    check_model_dir("reward_model_name_or_path", tiny_rm_dir, need_score_head=True)
    never_load(monkeypatch)
    with pytest.raises(ValueError, match=rf"reward_model_name_or_path={tiny_model_dir}: holds a LlamaForCausalLM without a trained score head"):
        build_trainer(ppo_argv(tiny_model_dir, tiny_model_dir, tiny_data_dir, str(tmp_path / "o")))
    with pytest.raises(ValueError, match=rf"model_name_or_path={tiny_model_dir}: holds a LlamaForCausalLM"):
        audit_main(["--model_name_or_path", tiny_model_dir, "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl"])


@pytest.mark.parametrize("entry", ["sft", "dpo", "rm"])
def test_trainer_entry_points_validate_before_loading(entry, tiny_data_dir, tmp_path, monkeypatch):
    from dpo.run_dpo import main as run_dpo
    from rm.run_reward import main as run_rm
    from sft.run_sft import main as run_sft

    never_load(monkeypatch)
    main, config, data = {"sft": (run_sft, "sft", "Jsonfile:1.0:{}/sft.jsonl"), "dpo": (run_dpo, "dpo", "PKU-SafeRLHF/train:1.0:{}/preference.jsonl"),
                          "rm": (run_rm, "rm", "PKU-SafeRLHF/train:1.0:{}/preference.jsonl")}[entry]
    argv = [f"config/tiny/{config}_argument.json", "--model_name_or_path", str(tmp_path / "missing"),
            "--train_datasets", data.format(tiny_data_dir), "--output_dir", str(tmp_path / "o")]
    with pytest.raises(ValueError, match=r"model_name_or_path=.*missing: no such directory"):
        main(argv)
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=0"):
        main(argv + ["--per_device_train_batch_size", "0"])


# ---------------------------------------------------------------- one start-up pass per entry point (issues 28, 32)


def entry_argv(config, model, data, out, *extra):
    return [f"config/tiny/{config}_argument.json", "--model_name_or_path", model, "--train_datasets", data,
            "--output_dir", out, *extra]


def test_output_dir_equal_to_the_input_model_is_refused(tiny_model_dir, tiny_data_dir, monkeypatch):
    """rm/run_reward.py with output_dir == model_name_or_path used to replace the SFT model."""
    from rm.run_reward import main as run_rm
    from sft.run_sft import main as run_sft

    never_load(monkeypatch)
    preference = f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl"
    with pytest.raises(ValueError, match=rf"output_dir={tiny_model_dir} is the input model directory of model_name_or_path"):
        run_rm(entry_argv("rm", tiny_model_dir, preference, tiny_model_dir))
    with pytest.raises(ValueError, match=r"output_dir=.* is the input model directory of model_name_or_path"):
        run_sft(entry_argv("sft", tiny_model_dir, f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl", tiny_model_dir + "/"))


def test_ppo_output_dir_equal_to_an_input_model_is_refused(tiny_model_dir, tiny_rm_dir, tiny_data_dir, monkeypatch):
    from ppo.run_ppo import build_trainer

    never_load(monkeypatch)
    with pytest.raises(ValueError, match=rf"output_dir={tiny_rm_dir} is the input model directory of reward_model_name_or_path"):
        build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tiny_rm_dir))


def test_do_train_false_is_refused_unless_evaluating(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    from dpo.run_dpo import main as run_dpo

    never_load(monkeypatch)
    argv = entry_argv("dpo", tiny_model_dir, f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl", str(tmp_path / "o"))
    with pytest.raises(ValueError, match="do_train is false or missing: the run would train and save nothing"):
        run_dpo(argv + ["--do_train", "false", "--do_eval", "false", "--evaluation_strategy", "no"])
    with pytest.raises(ValueError, match="do_train false with do_eval true evaluates only, but no eval_datasets"):
        run_dpo(argv[1:] + ["--do_train", "false", "--do_eval", "true"])  # no argument file: no eval datasets
    with pytest.raises(ValueError, match="do_predict true: prediction on a test set is not implemented here"):
        run_dpo(argv + ["--do_predict", "true"])


def test_do_train_false_with_do_eval_only_evaluates_and_says_so(tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    from sft.run_sft import main as run_sft

    out = tmp_path / "eval-only"
    data = f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl"
    with caplog.at_level("WARNING", logger="ppo"):
        run_sft(entry_argv("sft", tiny_model_dir, data, str(out), "--do_train", "false", "--do_eval", "true",
                                     "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--max_steps", "1"))
    assert "do_train is false: this run only evaluates (do_eval); nothing is trained or saved" in caplog.text
    summary = json.load(open(out / "summary.json"))
    assert summary["global_step"] == 0 and summary["final"]["eval/loss"] > 0, summary
    assert not (out / "model_state.pdparams").exists() and not (out / "config.json").exists()


def test_bf16_on_a_cpu_build_is_refused_naming_dtype_and_device(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    import paddle

    from sft.run_sft import main as run_sft

    never_load(monkeypatch)
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: False)
    argv = entry_argv("sft", tiny_model_dir, f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl", str(tmp_path / "o"))
    with pytest.raises(ValueError, match=r"bf16 true: this Paddle build runs on the CPU only \(device cpu\), which has no "
                                         r"bf16 training kernels; set bf16 false"):
        run_sft(argv + ["--bf16", "true"])
    with pytest.raises(ValueError, match=r"fp16 true: this Paddle build runs on the CPU only \(device cpu\)"):
        run_sft(argv + ["--fp16", "true"])


def test_paddlenlp_s_own_refusal_joins_the_other_problems(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    from sft.run_sft import main as run_sft

    never_load(monkeypatch)
    argv = entry_argv("sft", tiny_model_dir, f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl", str(tmp_path / "o"),
                      "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/valid.jsonl", "--load_best_model_at_end", "true", "--evaluation_strategy", "steps", "--save_strategy", "steps",
                      "--eval_steps", "3", "--save_steps", "5", "--lora_rank", "0", "--recompute_granularity", "some")
    with pytest.raises(ValueError) as info:
        run_sft(argv)
    lines = str(info.value).splitlines()
    assert lines[0] == "3 arguments cannot be used:", lines
    assert any(line.strip().startswith("PaddleNLP TrainingArguments refused the values: --load_best_model_at_end") for line in lines)
    assert "  recompute_granularity must be one of ('full', 'full_attn', 'core_attn'), got 'some'" in lines
    assert "  lora_rank=0 (must be an integer >= 1)" in lines



@pytest.mark.parametrize("module", ["rm.audit_reward", "rm.audit_cost"])
def test_both_audits_list_their_problems_with_one_validation(module, tmp_path, monkeypatch):
    """Both audit entry points run `rm.audit_arguments.validate_arguments`: a missing model
    directory and no held-out data in one error, before anything loads or is written."""
    import importlib

    from ppo.common.argument_parsing import ArgumentError
    from rm import audit_arguments

    assert not hasattr(audit_arguments, "validate_cost_audit_arguments")  # one validation for both audits
    never_load(monkeypatch)
    with pytest.raises(ArgumentError) as info:
        importlib.import_module(module).main(["--model_name_or_path", str(tmp_path / "missing"), "--output_dir", str(tmp_path / "o")])
    assert "eval_datasets" in str(info.value) and str(tmp_path / "missing") in str(info.value)
    assert not (tmp_path / "o").exists()
