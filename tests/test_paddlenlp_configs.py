"""Every PaddleNLP alignment argument file in tests/fixtures/paddlenlp (current files, other folders
and older versions, see the README there) on its entry point: each parses with no refused key, or
with the refusals listed here, each naming a feature docs/paddlenlp.md lists as missing; and each
runs 2 steps on CPU with the model, data and sizes swapped for tiny ones (the GPU/cluster
settings a 1-CPU run cannot have swapped too), as tests/test_paddlenlp_dropin.py does. A few
runs are in the default suite; the rest are marked slow."""
import glob
import json
import os

import numpy as np
import pytest

from ppo.common.argument_files import load_argument_file
from ppo.common.argument_parsing import parse_collecting
from tests.test_paddlenlp_dropin import (  # noqa: F401  (post_only_server: a fixture)
    CPU_OVERRIDES,
    FIXTURES,
    entry_classes,
    fixture,
    metrics,
    paddlenlp_dpo_file,
    post_only_server,
    trainer_sizes,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = open(os.path.join(ROOT, "docs", "paddlenlp.md")).read()

REFUSED = {
    # file: (what the refusal message says, the missing feature's name in docs/paddlenlp.md)
    "alignment/ppo/grpo_config.json": [("adv_estimator grpo needs rollout_n >= 2", "GRPO with one sample per prompt")],
    "history/abaa0af/llama/ppo_argument.json": [("'save_strategy: epoch' is not supported", "`save_strategy` (`epoch`")],
    # tensor_parallel_degree 2 needs two processes: one CPU process has degree 1, and a rollout at degree 2 would reshard
    "qwen/grpo_argument_qwen2_7B_TP2Sharing2_0507.yaml": [
        ("rollout_tensor_parallel_degree 2 with tensor_parallel_degree 1", "`rollout_tensor_parallel_degree`")],
}


def config_files():
    files = glob.glob(f"{FIXTURES}/**/*.json", recursive=True) + glob.glob(f"{FIXTURES}/**/*.yaml", recursive=True)
    return sorted(os.path.relpath(f, FIXTURES) for f in files)


def entry_kind(name):
    """The entry point a PaddleNLP file runs on here (rl: rl/run_rl.py, the PPO arguments)."""
    base = os.path.basename(name)
    if base.startswith(("sft", "lora")):
        return "sft"
    if base.startswith(("rm", "prm")):
        return "rm"
    if base.startswith("kto"):
        return "kto"
    if base.startswith(("dpo", "simpo")):
        return "dpo"
    return "rl" if name.endswith(".yaml") else "ppo"


def parse_problems(name, *flags):
    kind = "ppo" if entry_kind(name) == "rl" else entry_kind(name)
    _, problems = parse_collecting(entry_classes(kind), [fixture(name), "--output_dir", "/tmp/pnlp-parse", "--bf16", "false",
                                                         "--fp16", "false", *flags])
    return problems


def test_the_fixtures_hold_every_collected_file():
    assert len(config_files()) >= 55
    for name in REFUSED:
        assert name in config_files()


@pytest.mark.parametrize("name", config_files())
def test_file_parses_with_no_refused_key(name):
    """bf16 aside (the CPU refuses it), every key is read, or refused naming a feature docs/paddlenlp.md lists."""
    problems = parse_problems(name)
    expected = REFUSED.get(name, [])
    assert len(problems) == len(expected), problems
    for said, feature in expected:
        assert any(said in p for p in problems), (said, problems)
        assert feature in DOCS, f"docs/paddlenlp.md does not list {feature}"


def test_older_names_read_as_the_current_ones():
    """PaddleNLP's Qwen GRPO file as it was at 32cae05: quant_type, mini_batch_size, per_device_rollout_batch_size
    (prompts per generation call: x rollout_n rows) and use_fp32_compute false (log-probs in the training dtype)."""
    model, data, train = parse_arguments_of("history/32cae05/qwen/grpo_argument.yaml")
    assert train.global_mini_batch_size == 2 and train.rollout_max_num_seqs == 1 * 8
    assert train.use_fp32_compute is False and train.adv_estimator == "grpo"
    _, data, _ = parse_arguments_of("history/7ed2381/qwen/grpo_argument.json")
    assert data.response_key == "tgt"  # label_key
    assert parse_problems("history/32cae05/qwen/grpo_argument.yaml", "--bf16", "true") == []  # as written: bf16 true
    assert parse_arguments_of("history/32cae05/qwen/grpo_argument.yaml", "--bf16", "true")[2].logprob_dtype == "bfloat16"
    problems = parse_problems("history/32cae05/qwen/grpo_argument.yaml", "--quant_type", "weight_only_int8")
    assert any("'quant_type: weight_only_int8' is not supported here" in p for p in problems)


def parse_arguments_of(name, *flags):
    from ppo.common.argument_parsing import parse_arguments

    kind = "ppo" if entry_kind(name) == "rl" else entry_kind(name)
    return parse_arguments(entry_classes(kind), [fixture(name), "--output_dir", "/tmp/pnlp-parse", "--bf16", "false", *flags])


# ---------------------------------------------------------------- 2 steps on CPU

RL_SWAPS = {  # file -> flags besides the common ones: the refused GPU/cluster setting, data shapes
    "qwen/vapo_argument_kk.yaml": ["--pretrain_critic_steps", "1"],  # step 2 trains the actor (vapo_argument.yaml: 50, both critic-only)
    "qwen/grpo_argument_qwen2_7B_TP2Sharing2_0507.yaml": ["--rollout_tensor_parallel_degree", "-1"],
}
RL_FILES = [n for n in config_files() if entry_kind(n) in ("rl", "ppo") and n not in REFUSED or n in RL_SWAPS]
RL_FAST = ("qwen/vapo_argument.yaml", "history/32cae05/qwen/grpo_argument.yaml")


def rl_flags(name, out, models, data_dir, server):
    data = load_argument_file(fixture(name))
    algorithm = data.get("rl_algorithm", "ppo")
    samples = "1" if algorithm == "ppo" else "2"
    flags = [*CPU_OVERRIDES, "--sequence_parallel", "false", "--recompute", "false", "--output_dir", out,
             "--logging_dir", f"{out}/vdl", "--max_steps", "2", "--max_length", "96", "--max_prompt_len", "80",
             "--max_dec_len", "6", "--min_dec_len", "1", "--per_device_eval_batch_size", "8", "--evaluation_strategy", "no",
             "--do_eval", "false", "--save_steps", "0", "--offload_level", "", "--num_sample_generations", "0",
             "--report_to", "visualdl", "--rollout_n", samples, "--per_device_train_batch_size", "4",
             "--actor_model_name_or_path", models["actor"], "--train_datasets", f"{data_dir}/prompts.jsonl",
             "--eval_datasets", f"{data_dir}/test.jsonl"]
    if "global_batch_size" in data or "mini_batch_size" in data:
        flags += ["--global_batch_size", "4"] + ([] if "mini_batch_size" in data else ["--global_mini_batch_size", "-1"])
        flags += ["--per_device_logprob_batch_size", "-1", "--per_device_value_batch_size", "-1",
                  "--per_device_reward_batch_size", "-1"]
    else:
        flags += ["--per_device_prompt_batch_size", "4", "--gradient_accumulation_steps", "1"]
    if data.get("use_rm_server"):
        flags += ["--reward_server", server.address]
    elif not data.get("use_rule_reward"):
        flags += ["--reward_model_name_or_path", models["rm"]]
    if algorithm in ("ppo", "vapo") and "critic_model_name_or_path" in data:
        flags += ["--critic_model_name_or_path", models["rm"]]
    if data.get("ptx_datasets"):
        flags += ["--ptx_datasets", f"Jsonfile:1:{data_dir}/sft.jsonl"]
    return algorithm, flags + RL_SWAPS.get(name, [])


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in RL_FAST else [pytest.mark.slow]) for n in RL_FILES])
def test_rl_file_runs_two_steps(name, tiny_model_dir, tiny_rm_dir, tiny_data_dir, post_only_server, tmp_path):
    """Through rl/run_rl.py (PaddleNLP's entry name) for the YAML files, ppo/run_ppo.py for the JSON ones."""
    if entry_kind(name) == "rl":
        from rl.run_rl import build_trainer
    else:
        from ppo.run_ppo import build_trainer

    out = str(tmp_path / "run")
    algorithm, flags = rl_flags(name, out, {"actor": tiny_model_dir, "rm": tiny_rm_dir}, tiny_data_dir, post_only_server)
    trainer = build_trainer([fixture(name), *flags])
    trainer.train()
    rows = [r for r in metrics(out) if "objective/scores" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["objective/scores"]) for r in rows)
    resolved = json.load(open(f"{out}/resolved_arguments.json"))["PPOTrainingArguments"]
    assert resolved["adv_estimator"] == {"ppo": "gae", "reinforce_plus_plus": "reinforce_pp"}.get(algorithm, algorithm)
    if algorithm in ("ppo", "vapo"):
        assert all(np.isfinite(r["loss/value_avg"]) for r in rows)
    pretrain = resolved["pretrain_critic_steps"]  # VAPO's value pretraining: the first steps train the critic alone
    if pretrain:
        assert [r["train/critic_pretrain"] for r in rows] == [float(r["step"] <= pretrain) for r in rows]
        assert all(("loss/policy_avg" in r) == (r["step"] > pretrain) for r in rows)


DPO_FILES = [n for n in config_files() if entry_kind(n) in ("dpo", "kto") and n not in REFUSED]
DPO_FAST = ("baichuan/dpo_argument.json",  # PaddleNLP's older dpo_beta / dpo_loss_type / dpo_label_smoothing
            "llama/flashmask/dpo.json")  # lazy: true


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in DPO_FAST else [pytest.mark.slow]) for n in DPO_FILES])
def test_dpo_family_file_runs_two_steps(name, tiny_model_dir, tiny_data_dir, tmp_path):
    from dpo import run_dpo, run_kto

    main = run_kto.main if entry_kind(name) == "kto" else run_dpo.main
    data = paddlenlp_dpo_file(tiny_data_dir, tmp_path / "train.jsonl")
    out = str(tmp_path / "dpo")
    lora = ["--lora_rank", "4"] if load_argument_file(fixture(name)).get("lora") else []
    main([fixture(name), *CPU_OVERRIDES, *trainer_sizes(out), "--model_name_or_path", tiny_model_dir,
          "--train_dataset_path", data, "--dev_dataset_path", data, "--max_seq_len", "96", "--max_prompt_len", "48",
          "--flash_mask", "false", "--recompute", "false", *lora])
    rows = [r for r in metrics(out) if any(k.startswith(("loss/", "kto/")) for k in r)]
    assert rows and max(r["step"] for r in rows) == 2


RM_FILES = [n for n in config_files() if entry_kind(n) == "rm" and n not in REFUSED]
RM_FAST = ("llama/prm_flashmask_argument.json", "llama/flashmask/rm.json")  # the latter: lazy and benchmark true


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in RM_FAST else [pytest.mark.slow]) for n in RM_FILES])
def test_reward_file_runs_two_steps(name, tiny_model_dir, tiny_data_dir, tmp_path):
    from rm.run_reward import main

    out = str(tmp_path / "rm")
    config = load_argument_file(fixture(name))
    if config.get("process_reward"):
        from ppo.tiny import prm_data

        prm_data.generate(str(tmp_path / "prm"), num_train=64, num_eval=16)
        data = ["--train_dataset_path", str(tmp_path / "prm" / "prm_train.jsonl"),
                "--dev_dataset_path", str(tmp_path / "prm" / "prm_eval.jsonl"), "--placeholder_token", "|"]
        loss = "prm/loss"
    elif "train_dataset_path" in config:
        pairs = paddlenlp_dpo_file(tiny_data_dir, tmp_path / "train.jsonl")
        data, loss = ["--train_dataset_path", pairs, "--dev_dataset_path", pairs], "rm/loss"
    else:
        data = ["--train_datasets", f"PKU-SafeRLHF-30K/train:1:{tiny_data_dir}/preference.jsonl",
                "--eval_datasets", f"PKU-SafeRLHF-30K/test:1:{tiny_data_dir}/preference_eval.jsonl"]
        loss = "rm/loss"
    length = ["--max_seq_len", "96"] if "max_seq_len" in config else ["--max_length", "96"]
    main([fixture(name), *CPU_OVERRIDES, *trainer_sizes(out), "--model_name_or_path", tiny_model_dir,
          "--recompute", "false", "--max_grad_norm", "1.0", *length, *data])
    rows = [r for r in metrics(out) if loss in r]
    assert rows and max(r["step"] for r in rows) == 2 and all(np.isfinite(r[loss]) for r in rows)
    if config.get("benchmark"):  # trains only: the timing report, no model
        report = json.load(open(os.path.join(out, "benchmark.json")))
        assert report["steps"] == 2 and report["tokens"] > 0 and not os.path.exists(os.path.join(out, "config.json"))


SFT_FLASHMASK = ("llama/flashmask/sft.json", "llama/flashmask/lora.json")  # lazy: true; lora.json also benchmark: true


@pytest.mark.parametrize("name", SFT_FLASHMASK)
def test_flashmask_sft_file_runs_two_steps(name, tiny_model_dir, tiny_data_dir, tmp_path):
    """PaddleNLP's flashmask SFT files: the data streamed from DIR/train.json (zero_padding packs
    each batch), tensor_parallel_output true at one tensor-parallel rank (nothing to split);
    lora.json's benchmark trains only: the timing report, no model or adapter."""
    from sft.run_sft import main

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "train.json").write_text(open(f"{tiny_data_dir}/sft.jsonl").read())
    out = str(tmp_path / "sft")
    lora = ["--lora_rank", "4"] if load_argument_file(fixture(name)).get("lora") else []
    main([fixture(name), *CPU_OVERRIDES, *trainer_sizes(out), "--model_name_or_path", tiny_model_dir,
          "--dataset_name_or_path", str(data_dir), "--src_length", "48", "--max_length", "96", "--recompute", "false",
          "--flash_mask", "false", *lora])
    rows = [r for r in metrics(out) if "loss/sft" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss/sft"]) for r in rows)
    resolved = json.load(open(f"{out}/resolved_arguments.json"))
    assert resolved["DataArgument"]["lazy"] is True and resolved["ModelArgument"]["tensor_parallel_output"] is True
    benchmark = load_argument_file(fixture(name)).get("benchmark", False)
    assert os.path.isfile(os.path.join(out, "benchmark.json")) == benchmark
    saved = [f for f in ("lora_config.json", "model_state.pdparams", "model.safetensors") if os.path.isfile(os.path.join(out, f))]
    assert bool(saved) != benchmark, saved


def test_tensor_parallel_output_is_refused_only_where_it_splits_the_logits():
    from types import SimpleNamespace

    from ppo.common.validation import split_logits_problems

    model = SimpleNamespace(tensor_parallel_output=True)
    assert split_logits_problems(model, SimpleNamespace(tensor_parallel_degree=1)) == []
    problems = split_logits_problems(model, SimpleNamespace(tensor_parallel_degree=2))
    assert len(problems) == 1 and "split over the 2 tensor-parallel ranks" in problems[0]
    assert split_logits_problems(SimpleNamespace(tensor_parallel_output=False), SimpleNamespace(tensor_parallel_degree=2)) == []
