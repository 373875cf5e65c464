"""SFT entry point: a tiny real run, its traces, and LoRA adapter-only training + merge."""
import json
import os

import numpy as np
import paddle
from paddlenlp.transformers import AutoModelForCausalLM

from ppo.models.loading import load_causal_lm
from sft.merge_lora import main as merge_lora_main
from sft.run_sft import main as run_sft


def sft_argv(model_dir, data_dir, out, *extra):
    return [
        "config/tiny/sft_argument.json",
        "--model_name_or_path", model_dir,
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/sft.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", "30", "--per_device_train_batch_size", "32", "--logging_steps", "5", "--learning_rate", "1e-2",
        "--eval_steps", "30", "--save_steps", "30", "--warmup_steps", "3", "--disable_tqdm", "true",
        *extra,
    ]


def read_jsonl(path):
    return [json.loads(ln) for ln in open(path)]


def test_sft_run_writes_traces_and_learns(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "sft")
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out))
    lines = read_jsonl(f"{out}/metrics.jsonl")
    losses = [r["loss/sft"] for r in lines if "loss/sft" in r]
    assert len(losses) >= 5 and losses[-1] < 0.75 * losses[0], losses
    assert all(np.isfinite(losses))
    summary = json.load(open(f"{out}/summary.json"))
    final_eval = summary["final_eval"]
    for key in ("eval/accuracy", "eval/accuracy_long", "eval/accuracy_short"):
        assert 0.0 <= final_eval[key] <= 1.0, (key, final_eval[key])
    assert 0.0 < final_eval["eval/response_length"] <= 12, final_eval  # eval_max_new_tokens (12) caps it
    assert summary["global_step"] == 30
    resolved = json.load(open(f"{out}/resolved_arguments.json"))
    assert resolved["ModelArgument"]["model_name_or_path"] == tiny_model_dir
    assert resolved["SFTTrainingArguments"]["max_steps"] == 30
    samples = read_jsonl(f"{out}/eval_samples.jsonl")
    assert len(samples) == 32 and {"prompt", "response", "label", "correct"} <= set(samples[0])
    from visualdl import LogReader

    vdl_files = [f for f in os.listdir(f"{out}/vdl") if f.startswith("vdlrecords")]
    assert vdl_files
    reader = LogReader(file_path=os.path.join(out, "vdl", vdl_files[0]))
    assert any("loss" in tag for tag in reader.get_tags().get("scalar", []))
    model = AutoModelForCausalLM.from_pretrained(out)  # reloadable
    assert model.config.hidden_size == 32


def test_lora_sft_changes_only_adapters_and_merges(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "lora")
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--use_lora", "true", "--lora_rank", "4", "--learning_rate", "1e-2",
                     "--eval_with_do_generation", "false"))
    assert os.path.isfile(f"{out}/lora_config.json") and os.path.isfile(f"{out}/lora_model_state.pdparams")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    lora = load_causal_lm(out)
    lora.eval()
    trained = lora.state_dict()
    changed_adapter = False
    for name, value in trained.items():
        if "lora_" in name:
            changed_adapter |= "lora_B" in name and float(value.abs().sum()) > 0  # B starts at zero
        else:
            base_name = name[len("model."):] if name.startswith("model.") else name
            np.testing.assert_array_equal(value.numpy(), base[base_name].numpy(), err_msg=name)
    assert changed_adapter
    merged_dir = str(tmp_path / "merged")
    merge_lora_main(["--lora_path", out, "--output_dir", merged_dir])  # the one-command merge
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    merged.eval()
    ids = paddle.to_tensor([[1, 4, 7, 6, 7, 80, 26, 93, 7, 5]])
    lora_unmerged = load_causal_lm(out)
    lora_unmerged.eval()
    with paddle.no_grad():
        a = lora_unmerged(input_ids=ids, return_dict=True).logits.numpy()
        b = merged(input_ids=ids, return_dict=True).logits.numpy()
        c = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids, return_dict=True).logits.numpy()
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.abs(a - c).max() > 1e-4  # the adapter did something
