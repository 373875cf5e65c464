"""PaddleNLP users' argument files, data and reward servers work here unchanged.

The argument files under tests/fixtures/paddlenlp are PaddleNLP's own (see the README
there). They are parsed as they are by the matching entry point; the runs swap only
the model/data paths and sizes (and the GPU/cluster settings a 1-CPU test cannot
have) with command-line overrides.
"""
import json
import logging
import math
import os
import threading

import numpy as np
import pytest

from ppo.common import paddlenlp_keys as pk
from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.data import DataError, PaddleNLPPreferenceDataset, RawDataset, parse_dataset_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "paddlenlp")


def fixture(name):
    return os.path.join(FIXTURES, name)


def entry_classes(kind):
    if kind in ("ppo", "grpo", "reinforce"):
        from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments

        return ModelArgument, DataArgument, PPOTrainingArguments
    if kind == "sft":
        from sft.sft_arguments import DataArgument, ModelArgument, SFTTrainingArguments

        return ModelArgument, DataArgument, SFTTrainingArguments
    if kind == "rm":
        from rm.reward_arguments import DataArgument, ModelArgument, RewardTrainingArguments

        return ModelArgument, DataArgument, RewardTrainingArguments
    from dpo.dpo_arguments import DataArgument, DPOTrainingArguments, ModelArgument
    from dpo.run_kto import KTOTrainingArguments

    return ModelArgument, DataArgument, KTOTrainingArguments if kind == "kto" else DPOTrainingArguments


def parse(name, *flags, tmp="/tmp/paddlenlp-dropin-parse"):
    kind = os.path.basename(name).split("_")[0]
    return parse_arguments(entry_classes(kind), [fixture(name), "--output_dir", tmp, *flags])


# ---------------------------------------------------------------- parsing PaddleNLP's files unchanged


def test_ppo_files_parse_with_mapped_keys():
    model, data, train = parse("llama/ppo_argument.json")
    assert train.adv_estimator == "gae" and train.max_steps == 17 and train.ptx_coeff == 16.0
    assert train.recompute and model.recompute_granularity == "full" and model.recompute_use_reentrant
    assert train.critic_recompute and train.critic_recompute_granularity == "full"
    assert model.fused_linear and not model.use_fused_head_and_loss_fn and not model.tensor_parallel_output
    assert data.train_datasets == ["PKU-SafeRLHF/train"] and data.ptx_datasets == ["alpaca"]


@pytest.mark.parametrize("name", ["llama/grpo_argument.json", "qwen/grpo_argument.json"])
def test_grpo_files_parse_with_mapped_keys(name):
    model, data, train = parse(name)
    assert train.adv_estimator == "grpo"  # rl_algorithm: grpo
    assert train.rollout_n == 8  # rollout_n (llama) / num_return_sequences (qwen)
    assert model.use_rm_server and model.reward_server == "http://127.0.0.1:8731"
    assert train.recompute and model.recompute_use_reentrant and model.fused_linear
    # a bare path in train_datasets is a Jsonfile at that path
    assert parse_dataset_spec(data.train_datasets) == [("Jsonfile", 1.0, "ppo-kk/34567ppl/train.jsonl")]
    assert parse_dataset_spec(data.eval_datasets) == [("Jsonfile", 1.0, "ppo-kk/5ppl/test.jsonl")]


@pytest.mark.parametrize("name", ["llama/sft_argument.json", "qwen/sft_argument.json"])
def test_sft_files_parse_with_mapped_keys(name, tmp_path):
    model, data, train = parse(name)
    assert data.train_datasets == ["Jsonfile:1:./data/train.json"]  # dataset_name_or_path
    assert data.truncate_prompt_len == 1024 and data.max_length == 2048  # src_length, max_length
    assert train.num_train_epochs == 3 and not train.eval_with_do_generation
    # with a dev.json beside train.json, dataset_name_or_path gives the eval set too
    (tmp_path / "train.json").write_text("")
    (tmp_path / "dev.json").write_text("")
    _, data, _ = parse(name, "--dataset_name_or_path", str(tmp_path))
    assert data.train_datasets == [f"Jsonfile:1:{tmp_path}/train.json"]
    assert data.eval_datasets == [f"Jsonfile:1:{tmp_path}/dev.json"]


def test_rm_file_parses():
    model, data, train = parse("llama/rm_argument.json")
    assert data.train_datasets == ["PKU-SafeRLHF-30K/train"] and train.loss_type == "sequence-wise"
    assert model.normalizer_type == "ExponentialMovingAverage" and train.regularization == 0.001
    assert RawDataset.resolve("PKU-SafeRLHF-30K/train") is RawDataset.resolve("PKU-SafeRLHF/train")
    assert RawDataset.resolve("PKU-SafeRLHF-10K/train") is RawDataset.resolve("PKU-SafeRLHF/train")
    assert RawDataset.resolve("PKU-SafeRLHF-30K/test") is RawDataset.resolve("PKU-SafeRLHF/test")


@pytest.mark.parametrize(
    "name, loss_type, beta",
    [
        ("llama/dpo_argument.json", "sigmoid", 0.1),
        ("qwen/dpo_argument.json", "sigmoid", 0.1),
        ("llama/simpo_argument.json", "simpo", 2.0),
        ("llama/kto_argument.json", "kto", 0.1),  # dpo/run_kto.py, as PaddleNLP's run_kto.py
        ("qwen/kto_argument.json", "kto", 0.1),
    ],
)
def test_dpo_family_files_parse_with_mapped_keys(name, loss_type, beta):
    model, data, train = parse(name)
    assert train.loss_type == loss_type and train.beta == beta
    assert data.train_datasets == [f"{pk.PADDLENLP_DPO_DATASET}:1:./data/train.jsonl"]  # train_dataset_path
    assert data.eval_datasets == [f"{pk.PADDLENLP_DPO_DATASET}:1:./data/dev.jsonl"]  # dev_dataset_path
    assert data.max_length == 4096 and data.truncate_prompt_len == 2048  # max_seq_len, max_prompt_len (truncates here)
    assert model.recompute_granularity == "full" and not train.recompute
    if name.startswith("llama/simpo"):
        assert train.simpo_gamma == 1.0
    _, _, train = parse(name, "--loss_type", "ipo")
    assert train.loss_type == "ipo"


@pytest.mark.parametrize("name", ["llama/dpo_lora_argument.json", "qwen/dpo_lora_argument.json"])
def test_dpo_lora_files_parse_with_rslora_plus(name):
    model, _, _ = parse(name)
    assert model.use_lora and model.lora_rank == 64 and model.rslora_plus  # lora -> use_lora
    settings = model.lora_settings()
    assert settings["alpha"] == 4 and settings["rslora"] and settings["lora_plus_scale"] == 4.0  # PaddleNLP's preset


YAML_UNSUPPORTED = {
    "qwen/grpo_argument.yaml": set(),
    "qwen/reinforce_plus_plus_argument.yaml": set(),
    "qwen/ppo_argument.yaml": set(),
}
"""Keys of PaddleNLP's current Qwen YAML files that are refused here (empty once every one is
implemented)."""


@pytest.mark.parametrize("name", sorted(YAML_UNSUPPORTED))
def test_yaml_files_parse_with_no_refused_key(name):
    """Every key of PaddleNLP's current Qwen RL files is read here (bf16 aside: the CPU refuses it)."""
    assert not YAML_UNSUPPORTED[name]
    _, _, train = parse(name, "--bf16", "false")
    assert train.balance_batch and train.use_remove_padding
    if name == "qwen/ppo_argument.yaml":
        assert (train.global_batch_size, train.global_mini_batch_size, train.rollout_max_num_seqs) == (256, 64, 1024)
        assert [train.pass_rows(w) for w in ("logprob", "reward", "value")] == [4, 2, 2]
    else:
        assert (train.global_batch_size, train.global_mini_batch_size, train.rollout_max_num_seqs) == (8, -1, 32)
        assert [train.pass_rows(w) for w in ("logprob", "reward", "value")] == [8, 8, 8]
    # the global batch over one data-parallel rank; PaddleNLP's -1 mini-batch is the whole global batch
    assert train.per_device_prompt_batch_size == train.global_batch_size
    assert train.update_micro_rows * train.update_accumulation_steps == train.mini_batch_prompts * train.rollout_n


@pytest.mark.parametrize(
    "name, estimator",
    [("qwen/grpo_argument.yaml", "grpo"), ("qwen/reinforce_plus_plus_argument.yaml", "reinforce_pp"), ("qwen/ppo_argument.yaml", "gae")],
)
def test_yaml_files_without_the_unsupported_keys_parse(name, estimator, tmp_path):
    import yaml

    data = yaml.safe_load(open(fixture(name)))
    for key in YAML_UNSUPPORTED[name]:
        data.pop(key)
    path = tmp_path / os.path.basename(name)
    path.write_text(yaml.safe_dump(data))
    model, data_args, train = parse_arguments(entry_classes("ppo"), [str(path), "--output_dir", str(tmp_path)])
    assert train.adv_estimator == estimator
    if estimator == "gae":
        assert model.reward_critic_model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"  # critic_model_name_or_path
        assert train.max_steps == -1 and train.num_train_epochs == 5 and model.use_fused_rms_norm
        assert model.use_rule_reward and model.rule_reward_scorers == "math"  # PaddleNLP's GSM8K rule
        assert train.entropy_coeff == 0.001 and train.pg_loss_coeff == 1.0
    else:
        assert train.max_steps == 3600 and train.dataloader_shuffle is False and train.recompute


def test_one_error_lists_every_bad_key_with_its_own_hint(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({
        "num_return_sequences": 4,  # mapped: no complaint
        "rolout_n": 2,  # typo
        "rollout_quant_type": "weight_only_int8",  # PaddleNLP feature not here
        "zero_padding": True,  # only PaddleNLP's default is supported
        "lazy": False,  # PaddleNLP's default: accepted
        "frobnicate": 1,
    }))
    with pytest.raises(ArgumentError) as info:
        parse_arguments(entry_classes("grpo"), [str(path), "--output_dir", str(tmp_path), "--rollout", "7"])
    message = str(info.value)
    assert message.startswith("5 arguments cannot be used")
    assert "'rolout_n'; did you mean 'rollout_n'?" in message
    assert "'rollout_quant_type: weight_only_int8' is not supported here (PaddleNLP: quantises" in message
    assert "'zero_padding: True' is not supported here (PaddleNLP: packs" in message and "only False is" in message
    assert "command line: unknown argument 'rollout'; did you mean 'rollout_n'?" in message  # the file and the flags, one error
    assert "num_return_sequences" not in message and "lazy" not in message and "frobnicate'" in message


def test_a_mapped_key_where_its_target_is_missing_gets_no_misleading_hint(tmp_path):
    with pytest.raises(ArgumentError) as info:
        parse_arguments(entry_classes("sft"), ["--output_dir", str(tmp_path), "--num_return_sequences", "4"])
    message = str(info.value)
    assert "'num_return_sequences' is PaddleNLP's name for 'rollout_n'" in message and "which this entry point does not have" in message
    assert "did you mean" not in message


def test_mapped_keys_work_on_the_command_line_and_conflicts_are_errors(tmp_path):
    _, _, train = parse_arguments(
        entry_classes("grpo"), ["--output_dir", str(tmp_path), "--rl_algorithm", "reinforce_plus_plus", "--num_return_sequences", "3"]
    )
    assert train.adv_estimator == "reinforce_pp" and train.rollout_n == 3
    with pytest.raises(ArgumentError, match="rl_algorithm must be one of"):
        parse_arguments(entry_classes("grpo"), ["--output_dir", str(tmp_path), "--rl_algorithm", "a2c"])
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"num_return_sequences": 4, "rollout_n": 2}))
    with pytest.raises(ArgumentError, match="'num_return_sequences' .PaddleNLP's name for 'rollout_n'. conflicts"):
        parse_arguments(entry_classes("grpo"), [str(path), "--output_dir", str(tmp_path)])
    _, _, train = parse_arguments(entry_classes("dpo"), ["--output_dir", str(tmp_path), "--loss_type", "or"])
    assert train.loss_type == "orpo"


def test_bad_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout_n: 2\nmax_steps: [1,\n")
    with pytest.raises(ArgumentError, match=r"bad.yaml: invalid YAML at line \d+"):
        parse_arguments(entry_classes("grpo"), [str(path)])


def test_max_steps_rules(tmp_path):
    with pytest.raises(ValueError, match="max_steps 0 would train no step"):
        parse_arguments(entry_classes("grpo"), ["--output_dir", str(tmp_path), "--max_steps", "0"])
    _, _, train = parse_arguments(
        entry_classes("grpo"),
        ["--output_dir", str(tmp_path), "--max_steps", "-1", "--num_train_epochs", "2", "--per_device_prompt_batch_size", "4",
         "--per_device_train_batch_size", "4"],
    )
    assert train.total_steps(10, world_size=1) == 2 * math.ceil(10 / 4) == 6
    assert train.total_steps(10, world_size=2) == 2 * math.ceil(10 / 8) == 4
    train.dataloader_drop_last = True
    assert train.total_steps(10, world_size=1) == 4
    with pytest.raises(ValueError, match="trains no step"):
        train.total_steps(3, world_size=1)


# ---------------------------------------------------------------- data as PaddleNLP users have it


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def test_paddlenlp_dpo_format_reads_pairs_and_multi_turn(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [
        {"src": "hi", "tgt": [], "response": ["good", "bad"], "sort": [1, 0]},
        {"src": ["q1", "q2"], "tgt": ["a1"], "response": ["worse", "better"], "sort": [0, 2]},
    ])
    samples = list(PaddleNLPPreferenceDataset(path))
    assert samples[0]["input"] == "hi" and samples[0]["better"] is True
    assert samples[1]["dialogue"] == ["q1", "a1", "q2"] and samples[1]["better"] is False
    assert (samples[1]["answer"], samples[1]["other_answer"]) == ("worse", "better")


@pytest.mark.parametrize(
    "record, field, reason",
    [
        ({"src": "q", "tgt": [], "response": ["only one"], "sort": [1]}, "response", "unpaired KTO"),
        ({"src": "q", "tgt": [], "response": ["a", "b"], "sort": [1, 1]}, "sort", "ranks are equal"),
        ({"src": "q", "tgt": ["x"], "response": ["a", "b"], "sort": [1, 0]}, "tgt", "expected 0 assistant turns"),
        ({"src": "q", "tgt": [], "response": ["a", " "], "sort": [1, 0]}, "response", "response 1 is empty"),
        ({"src": "q", "tgt": [], "response": ["a", "b"]}, "sort", "missing field"),
    ],
)
def test_paddlenlp_dpo_format_errors_name_file_line_field(tmp_path, record, field, reason):
    good = {"src": "q", "tgt": [], "response": ["a", "b"], "sort": [1, 0]}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, record])
    with pytest.raises(DataError) as info:
        list(PaddleNLPPreferenceDataset(path))
    message = str(info.value)
    assert path in message and "line 2" in message and f"'{field}'" in message and reason in message


def test_bare_paths_and_named_datasets_without_a_path(tmp_path):
    assert parse_dataset_spec("ppo-kk/34567ppl/train.jsonl") == [("Jsonfile", 1.0, "ppo-kk/34567ppl/train.jsonl")]
    assert parse_dataset_spec("data/x.json:0.5") == [("Jsonfile", 0.5, "data/x.json")]
    assert parse_dataset_spec("PKU-SafeRLHF/train") == [("PKU-SafeRLHF/train", 1.0, None)]
    for name in ("PKU-SafeRLHF/train", "PKU-SafeRLHF-30K/train", "PKU-SafeRLHF-10K/train", "alpaca"):
        with pytest.raises(DataError, match="Nothing is downloaded here: save the records"):
            RawDataset.load(name, None)


def test_prompt_truncation_keeps_the_end_of_the_prompt(tiny_model_dir, tmp_path):
    from ppo.data import SupervisedDataset
    from ppo.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    path = write_jsonl(tmp_path / "sft.jsonl", [{"src": ["a b c d e f g h i j k l"], "tgt": ["x"]}])
    whole = SupervisedDataset(f"Jsonfile:1:{path}", tokenizer, max_length=200)
    cut = SupervisedDataset(f"Jsonfile:1:{path}", tokenizer, max_length=200, truncate_prompt_to=5)
    full_prompt = [int(t) for t, lab in zip(whole[0]["input_ids"], whole[0]["labels"]) if lab == -100]
    cut_prompt = [int(t) for t, lab in zip(cut[0]["input_ids"], cut[0]["labels"]) if lab == -100]
    assert len(full_prompt) > 5 and cut_prompt == full_prompt[-5:]
    assert cut.stats["truncated_prompt"] == 1
    np.testing.assert_array_equal(cut[0]["labels"][-2:], whole[0]["labels"][-2:])


# ---------------------------------------------------------------- a reward server on PaddleNLP's contract


class PostOnlyServer:
    """PaddleNLP's reward-server contract and nothing more: `POST /` with `{src, tgt, response}`
    answers `{"error_code": 0, "error_msg": "Success", "score": [...]}` (1.0 when the response
    contains the reference). Any other path or method is Flask's 404/405."""

    def __init__(self):
        from flask import Flask, jsonify, request
        from werkzeug.serving import make_server

        app = Flask("paddlenlp_reward_server")
        self.requests = 0

        @app.route("/", methods=["POST"])
        def score():
            self.requests += 1
            data = request.get_json()
            scores = [1.0 if t.strip() and t.strip() in r else 0.0 for t, r in zip(data["tgt"], data["response"])]
            return jsonify({"error_code": 0, "error_msg": "Success", "score": scores})

        self.httpd = make_server("127.0.0.1", 0, app, threaded=True)
        self.address = f"127.0.0.1:{self.httpd.server_port}"  # no scheme, as PaddleNLP's files may give it
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def post_only_server():
    server = PostOnlyServer()
    yield server
    server.close()


def test_client_health_check_falls_back_to_a_probe(post_only_server):
    from ppo.serving.reward_client import RewardServerClient

    client = RewardServerClient(post_only_server.address, timeout=10, max_retries=0)
    before = post_only_server.requests
    health = client.check_health()
    assert health == {"status": "ok", "probe_score": 1.0} and post_only_server.requests == before + 1
    assert client.score(["q"], ["abc"], ["xx abc"]) == [1.0]


def test_client_stops_with_the_url_when_nothing_listens():
    from ppo.serving.reward_client import RewardServerClient, RewardServerError
    from tests.test_reward_server import free_port

    address = f"127.0.0.1:{free_port()}"
    client = RewardServerClient(address, timeout=2, max_retries=1, backoff=0.01)
    with pytest.raises(RewardServerError, match=f"http://{address}/health failed after 2 attempt"):
        client.check_health()


# ---------------------------------------------------------------- the files run 2 steps on CPU

CPU_OVERRIDES = [
    # a 1-process CPU run: no bf16, no model parallelism, no sharding, no flash attention
    "--bf16", "false", "--fp16", "false", "--tensor_parallel_degree", "1", "--sharding_parallel_degree", "1",
    "--sharding", "", "--use_flash_attention", "false", "--disable_tqdm", "true",
]


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def rl_sizes(out):
    return [
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "2", "--max_length", "96", "--max_prompt_len", "80",
        "--max_dec_len", "6", "--per_device_prompt_batch_size", "4", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "1", "--per_device_eval_batch_size", "8", "--evaluation_strategy", "no", "--do_eval", "false",
        "--save_steps", "0", "--offload_level", "", "--num_sample_generations", "0",
    ]


def test_grpo_file_runs_against_a_post_only_server(tiny_model_dir, tiny_data_dir, post_only_server, tmp_path):
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "grpo")
    trainer = build_trainer([
        fixture("qwen/grpo_argument.json"), *CPU_OVERRIDES, *rl_sizes(out),
        "--actor_model_name_or_path", tiny_model_dir, "--reward_server", post_only_server.address,
        "--train_datasets", f"{tiny_data_dir}/prompts.jsonl", "--eval_datasets", f"{tiny_data_dir}/test.jsonl",
        "--num_return_sequences", "4",
    ])
    assert trainer.passes.models.critic is None and trainer.experience.completion.estimator.name == "grpo" and trainer.experience.settings.rollout_n == 4
    assert trainer.experience.scoring.objectives[0].scorer.client.url == f"http://{post_only_server.address}"
    served = post_only_server.requests
    trainer.train()
    rows = [r for r in metrics(out) if "objective/scores" in r]
    assert len(rows) == 2 and all(0.0 <= r["objective/scores"] <= 1.0 for r in rows)
    assert post_only_server.requests >= served + 2


def recompute_layers(model):
    return [layer for layer in [model, *model.sublayers()] if getattr(layer, "enable_recompute", False)]


def test_llama_ppo_file_runs_with_recompute_in_actor_and_critic(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "ppo")
    trainer = build_trainer([
        fixture("llama/ppo_argument.json"), *CPU_OVERRIDES, *rl_sizes(out),
        "--actor_model_name_or_path", tiny_model_dir, "--reward_model_name_or_path", tiny_rm_dir,
        "--train_datasets", f"Jsonfile:1:{tiny_data_dir}/prompts.jsonl", "--eval_datasets", f"Jsonfile:1:{tiny_data_dir}/test.jsonl",
        "--ptx_datasets", f"Jsonfile:1:{tiny_data_dir}/sft.jsonl",
    ])
    models = trainer.passes.models
    assert models.critic is not None and trainer.learner.settings.ptx_coeff == 16.0
    for model in (models.actor, models.critic):  # recompute / critic_recompute of the file
        layers = recompute_layers(model)
        assert layers and all(layer.recompute_granularity == "full" for layer in layers if hasattr(layer, "recompute_granularity"))
    assert not recompute_layers(models.reference)
    trainer.train()
    rows = [r for r in metrics(out) if "objective/scores" in r]
    assert len(rows) == 2
    for r in rows:
        assert np.isfinite(r["loss/value_avg"]) and np.isfinite(r["objective/scores"])


def test_max_steps_minus_one_trains_the_epoch(tiny_model_dir, tmp_path, post_only_server):
    from ppo.run_ppo import build_trainer

    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"src": [f"say {w}"], "tgt": [w]} for w in "abcdefghij"])
    out = str(tmp_path / "epoch")
    sizes = [a for a in rl_sizes(out)]
    sizes[sizes.index("--max_steps") + 1] = "-1"
    trainer = build_trainer([
        fixture("llama/grpo_argument.json"), *CPU_OVERRIDES, *sizes, "--num_train_epochs", "1", "--rollout_n", "2",
        "--actor_model_name_or_path", tiny_model_dir, "--reward_server", post_only_server.address,
        "--train_datasets", prompts, "--eval_datasets", prompts,
    ])
    assert trainer.max_steps == math.ceil(10 / 4) == 3
    trainer.train()
    assert [r["step"] for r in metrics(out) if "objective/scores" in r] == [1, 2, 3]


def trainer_sizes(out):
    return [
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "2", "--logging_steps", "1",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--per_device_eval_batch_size", "8",
        "--warmup_steps", "0", "--evaluation_strategy", "no", "--do_eval", "false", "--save_strategy", "no",
        "--load_best_model_at_end", "false", "--unified_checkpoint", "false",
    ]


def check_two_steps(out, loss_key):
    rows = [r for r in metrics(out) if loss_key in r]
    assert rows and max(r["step"] for r in rows) == 2 and all(np.isfinite(r[loss_key]) for r in rows)


def test_sft_file_runs_on_a_dataset_directory(tiny_model_dir, tiny_data_dir, tmp_path):
    from sft.run_sft import main

    data_dir = tmp_path / "data"  # PaddleNLP's layout: DIR/train.json and DIR/dev.json, src/tgt lines
    data_dir.mkdir()
    (data_dir / "train.json").write_text(open(f"{tiny_data_dir}/sft.jsonl").read())
    (data_dir / "dev.json").write_text(open(f"{tiny_data_dir}/test.jsonl").read())
    out = str(tmp_path / "sft")
    main([fixture("llama/sft_argument.json"), *CPU_OVERRIDES, *trainer_sizes(out), "--model_name_or_path", tiny_model_dir,
          "--dataset_name_or_path", str(data_dir), "--src_length", "48", "--max_length", "96"])
    check_two_steps(out, "loss/sft")
    resolved = json.load(open(f"{out}/resolved_arguments.json"))
    assert resolved["DataArgument"]["eval_datasets"] == [f"Jsonfile:1:{data_dir}/dev.json"]
    assert resolved["DataArgument"]["truncate_prompt_len"] == 48


def test_rm_file_runs(tiny_model_dir, tiny_data_dir, tmp_path):
    from rm.run_reward import main

    out = str(tmp_path / "rm")
    main([fixture("llama/rm_argument.json"), *CPU_OVERRIDES, *trainer_sizes(out), "--model_name_or_path", tiny_model_dir,
          "--train_datasets", f"PKU-SafeRLHF-30K/train:1:{tiny_data_dir}/preference.jsonl",
          "--eval_datasets", f"PKU-SafeRLHF-30K/test:1:{tiny_data_dir}/preference_eval.jsonl", "--max_length", "96"])
    check_two_steps(out, "rm/loss")


def paddlenlp_dpo_file(tiny_data_dir, path):
    """The tiny PKU-SafeRLHF-schema pairs rewritten in PaddleNLP's DPO format."""
    records = []
    for line in open(f"{tiny_data_dir}/preference.jsonl"):
        r = json.loads(line)
        if not (r["response_0"].strip() and r["response_1"].strip()):
            continue  # PaddleNLP refuses empty responses too
        sort = [1, 0] if r["better_response_id"] == 0 else [0, 1]
        records.append({"src": [r["prompt"]], "tgt": [], "response": [r["response_0"], r["response_1"]], "sort": sort})
    return write_jsonl(path, records)


@pytest.mark.parametrize(
    "name, flags, loss_key",
    [
        ("llama/dpo_argument.json", ["--pref_loss_ratio", "0.5", "--sft_loss_ratio", "0.5"], "loss/sft"),
        ("qwen/dpo_lora_argument.json", ["--lora_rank", "4"], "loss/dpo"),
        ("llama/simpo_argument.json", [], "loss/dpo"),
        ("llama/kto_argument.json", [], "kto/kl"),
        ("qwen/dpo_argument.json", ["--loss_type", "dpop", "--dpop_lambda", "5"], "loss/dpo"),
    ],
)
def test_dpo_family_files_run(name, flags, loss_key, tiny_model_dir, tiny_data_dir, tmp_path):
    from dpo import run_dpo, run_kto

    main = run_kto.main if "kto_argument" in name else run_dpo.main

    data = paddlenlp_dpo_file(tiny_data_dir, tmp_path / "train.jsonl")
    out = str(tmp_path / "dpo")
    main([fixture(name), *CPU_OVERRIDES, *trainer_sizes(out), "--model_name_or_path", tiny_model_dir,
          "--train_dataset_path", data, "--dev_dataset_path", data, "--max_seq_len", "96", "--max_prompt_len", "48", *flags])
    check_two_steps(out, loss_key)


def test_readme_section_covers_the_key_table():
    from ppo.models.loading import GPU_ONLY_SWITCHES

    section = open(os.path.join(ROOT, "docs", "paddlenlp.md")).read()
    keys = [*pk.RENAMED, *pk.FIXED_VALUE, *pk.UNSUPPORTED, *pk.PPO_ONLY, *GPU_ONLY_SWITCHES, *pk.VALUE_ALIASES]
    keys += ["recompute", "critic_recompute", "recompute_granularity", "critic_recompute_granularity", "rslora_plus",
             "pref_loss_ratio", "dpop_lambda", "kto_pair", "sppo_hard", "nca_pair", "dpop", "tensor_parallel_output"]
    missing = [k for k in keys if f"`{k}" not in section]
    assert not missing, f"docs/paddlenlp.md lacks {missing}"
    for paddlenlp_value, ours in pk.RL_ALGORITHMS.items():
        assert f"`{paddlenlp_value}`" in section and f"`{ours}`" in section


def test_enable_recompute_recomputes_and_keeps_gradients(tiny_model_dir, monkeypatch):
    import paddle
    from paddlenlp.transformers.llama import modeling

    from ppo.models.loading import enable_recompute, load_causal_lm, set_dropout_off

    paddle.seed(3)
    model = set_dropout_off(load_causal_lm(tiny_model_dir))
    model.train()
    ids = paddle.to_tensor([[3, 5, 7, 9, 11, 13]], dtype="int64")

    def grads():
        model.clear_gradients()
        loss = model(input_ids=ids, labels=ids, return_dict=True).loss
        loss.backward()
        return {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    calls = []
    original = modeling.LlamaModel.recompute_training_full

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(modeling.LlamaModel, "recompute_training_full", counting)
    assert enable_recompute(model, "full") >= 1
    recomputed = grads()
    assert calls, "the decoder layers were not recomputed"
    assert plain.keys() == recomputed.keys() and plain
    for name in plain:
        np.testing.assert_allclose(recomputed[name], plain[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_gpu_only_switches_log_once_on_cpu_and_act_on_cuda(caplog):
    import types

    from ppo.models import loading

    args = types.SimpleNamespace(use_fused_rms_norm=True, use_fused_rope=False, use_fused_head_and_loss_fn=False,
                                 fused_linear=True, use_fused_linear=False, flash_mask=False, use_flash_attention=False)
    loading._logged_switches.clear()
    with caplog.at_level("WARNING", logger="ppo.models.loading"):
        assert loading.gpu_switch_overrides(args, cuda=False) == {}
        assert loading.gpu_switch_overrides(args, cuda=False) == {}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # once per switch that is on, however often models load
    assert any(ln.startswith("use_fused_rms_norm: this is a CPU build") and "fuse RMSNorm" in ln for ln in lines)
    args.fused_linear = False
    assert loading.gpu_switch_overrides(args, cuda=True) == {"use_fused_rms_norm": True}
    args.flash_mask = True
    with pytest.raises(ValueError, match="flash_mask .* is not implemented by the trainers here"):
        loading.gpu_switch_overrides(args, cuda=True)


def qwen_yaml(name, tmp_path):
    """PaddleNLP's Qwen YAML file `name` as it is, less the keys still refused here (`YAML_UNSUPPORTED`)."""
    import yaml

    if not YAML_UNSUPPORTED[name]:
        return fixture(name)
    data = yaml.safe_load(open(fixture(name)))
    for key in YAML_UNSUPPORTED[name]:
        data.pop(key)
    path = tmp_path / os.path.basename(name)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def recorded_plans(trainer):
    """Wrap the updater's optimiser step so each step's micro-batch row counts are recorded."""
    learner = trainer.learner
    plans, real = [], learner.update_on_plan

    def update_on_plan(exp, plan, response_mask, acc):
        plans.append([len(mb) for mb in plan])
        return real(exp, plan, response_mask, acc)

    learner.update_on_plan = update_on_plan
    return plans


QWEN_YAML_RUNS = {
    # name: (estimator, flags, optimiser steps per rollout x micro-batch rows)
    "qwen/grpo_argument.yaml": ("grpo", ["--rollout_n", "2", "--per_device_train_batch_size", "4",
                                         "--rollout_max_num_seqs", "3"], [[4, 4]]),
    "qwen/reinforce_plus_plus_argument.yaml": ("reinforce_pp", ["--rollout_n", "2", "--per_device_train_batch_size", "4"],
                                               [[4, 4]]),
    "qwen/ppo_argument.yaml": ("gae", ["--global_mini_batch_size", "2"], [[2], [2]]),
}


@pytest.mark.parametrize("name", sorted(QWEN_YAML_RUNS))
def test_qwen_yaml_files_run_two_steps(name, tiny_model_dir, tiny_rm_dir, tiny_data_dir, post_only_server, tmp_path, caplog):
    """PaddleNLP's current Qwen RL files, models, data and sizes swapped for tiny ones on the
    command line: global_batch_size 4 prompts, the file's mini-batch, micro-batch and rollout
    knobs acting (GRPO / REINFORCE++: one optimiser step of two micro-batches of 4 rows; PPO:
    global_mini_batch_size 2 gives two optimiser steps of 2 rows each)."""
    from ppo.run_ppo import build_trainer

    estimator, flags, plan = QWEN_YAML_RUNS[name]
    out = str(tmp_path / "run")
    models = (["--critic_model_name_or_path", tiny_rm_dir, "--use_rule_reward", "false", "--reward_model_name_or_path", tiny_rm_dir]
              if estimator == "gae" else ["--reward_server", post_only_server.address])
    with caplog.at_level(logging.INFO, logger="ppo"):
        trainer = build_trainer([
            qwen_yaml(name, tmp_path), *CPU_OVERRIDES, "--sequence_parallel", "false", "--recompute", "false",
            "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "2", "--max_length", "96", "--max_prompt_len", "80",
            "--max_dec_len", "6", "--min_dec_len", "1", "--global_batch_size", "4", "--per_device_eval_batch_size", "8",
            "--evaluation_strategy", "no", "--do_eval", "false", "--save_steps", "0", "--offload_level", "",
            "--num_sample_generations", "0", "--report_to", "visualdl", "--actor_model_name_or_path", tiny_model_dir,
            "--train_datasets", f"{tiny_data_dir}/prompts.jsonl", "--eval_datasets", f"{tiny_data_dir}/test.jsonl", *models, *flags,
        ])
    # one process: the file's balance_batch has nothing to balance, and says so
    assert any(r.getMessage().startswith("balance_batch: one data-parallel rank") for r in caplog.records)
    settings = trainer.experience.settings
    assert trainer.experience.completion.estimator.name == estimator and settings.per_device_prompt_batch_size == 4
    assert settings.balance_batch and trainer.passes.remove_padding  # the file as it is: packed rows
    plans = recorded_plans(trainer)
    trainer.train()
    rows = [r for r in metrics(out) if "objective/scores" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["objective/scores"]) for r in rows)
    assert plans == plan * 2
    if estimator == "gae":  # the file's per_device_value_batch_size 2 / per_device_logprob_batch_size 4
        assert trainer.passes.chunk_rows == {"logprob": 4, "value": 2, "reward": 2}
        assert all(np.isfinite(r["loss/value_avg"]) for r in rows)
    else:
        assert trainer.experience.rollout.engine.max_num_seqs == (3 if estimator == "grpo" else 32)  # rollout_max_num_seqs


def test_zero_padding_refusal_names_where_packing_works(tmp_path):
    """Online DPO gets the PPO family's refusal of zero_padding: it must not claim "the DPO family" packs there."""
    from dpo.online_dpo_arguments import DataArgument, ModelArgument, OnlineDPOTrainingArguments

    with pytest.raises(ArgumentError) as info:
        parse_arguments((ModelArgument, DataArgument, OnlineDPOTrainingArguments),
                        ["--zero_padding", "true", "--output_dir", str(tmp_path / "o")])
    assert "'zero_padding: true' is not supported here" in str(info.value)
    assert "dpo/run_dpo.py and dpo/run_kto.py" in str(info.value) and "online DPO runs padded" in str(info.value)


def test_ppo_only_knobs_are_refused_as_such_elsewhere(tmp_path):
    """Online DPO shares the rollout arguments but not PPO's batch and packing knobs: each is
    named as a PPO/GRPO argument, not as an unknown key with a far-fetched hint."""
    from dataclasses import fields

    from dpo.online_dpo_arguments import DataArgument, ModelArgument, OnlineDPOTrainingArguments
    from ppo.entry.ppo_arguments import PPOTrainingArguments

    assert set(pk.PPO_ONLY) <= {f.name for f in fields(PPOTrainingArguments)}
    flags = [x for key in pk.PPO_ONLY for x in (f"--{key}", "true" if key in ("balance_batch", "use_remove_padding") else "4")]
    with pytest.raises(ArgumentError) as info:
        parse_arguments((ModelArgument, DataArgument, OnlineDPOTrainingArguments), flags + ["--output_dir", str(tmp_path / "o")])
    message = str(info.value)
    for key in pk.PPO_ONLY:
        assert f"'{key}' is an argument of PPO/GRPO (ppo/run_ppo.py) only" in message
    assert "did you mean" not in message
