"""PaddleNLP's TrainingArguments in the PPO/GRPO loop: each field acts, is refused, or says once
why it does nothing.

SFT, RM and DPO run PaddleNLP's Trainer, which acts on every TrainingArguments field; PPO and
GRPO run the loop in ppo/entry/ppo_trainer.py. Every field of paddlenlp's TrainingArguments is read by
the PPO modules or sits in one of the tables of ppo/common/paddlenlp_keys.py, and the keys
PaddleNLP's own PPO/GRPO argument files set act as they do there.
"""
import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from ppo.common import paddlenlp_keys as pk
from ppo.common.argument_parsing import ArgumentError, parse_arguments
from tests.test_paddlenlp_dropin import CPU_OVERRIDES, YAML_UNSUPPORTED, entry_classes, fixture, metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = {"PPO_FIXED_VALUE": pk.PPO_FIXED_VALUE, "PPO_INERT": pk.PPO_INERT, "PPO_BY_PADDLENLP": pk.PPO_BY_PADDLENLP}


def training_argument_fields():
    from paddlenlp.trainer import TrainingArguments

    return [f for f in dataclasses.fields(TrainingArguments) if f.init]


LIST_PPO_MODULES = """
import json, os, sys
import ppo.run_ppo
root = os.path.join(sys.argv[1], "ppo") + os.sep
print(json.dumps(sorted({os.path.abspath(m.__file__) for m in list(sys.modules.values())
                         if getattr(m, "__file__", None) and os.path.abspath(m.__file__).startswith(root)})))
"""


def ppo_source():
    """Source of every module of this repository that `ppo/run_ppo.py` loads (listed in a fresh
    process: other tests import SFT/DPO modules here); attribute reads of the arguments are
    `args.X` (`training_args.X`, `self.args.X`) there and `self.X` in ppo_arguments.py."""
    out = subprocess.run([sys.executable, "-c", LIST_PPO_MODULES, ROOT], cwd=ROOT, capture_output=True, text=True, check=True)
    files = json.loads(out.stdout.strip().splitlines()[-1])
    assert os.path.join(ROOT, "ppo", "entry", "ppo_trainer.py") in files and os.path.join(ROOT, "ppo", "run_ppo.py") in files
    return {os.path.relpath(f, ROOT): open(f).read() for f in files}


def slice_fields():
    """Fields the loop's parts read through their argument slices (`ppo.trainer.settings`)."""
    from ppo.trainer import settings

    return {f.name for cls in vars(settings).values() if dataclasses.is_dataclass(cls) for f in dataclasses.fields(cls)}


def reads(sources, name):
    args_read = re.compile(r"args\.%s\b" % re.escape(name))
    self_read = re.compile(r"\bself\.%s\b" % re.escape(name))
    own = (os.path.join("ppo", "entry", "ppo_arguments.py"), os.path.join("ppo", "entry", "argument_groups.py"))
    found = [path for path, text in sources.items() if args_read.search(text) or (path in own and self_read.search(text))]
    return found + (["ppo/trainer/settings.py"] if name in slice_fields() else [])


INERT_ONLY_BELOW_PIPELINE_DEGREE_2 = ("pipeline_parallel_config",)
"""Said to do nothing at pipeline_parallel_degree 1 and read by the pipeline run above it."""


def test_conditionally_inert_fields_are_logged_only_where_inert():
    for name in INERT_ONLY_BELOW_PIPELINE_DEGREE_2:
        is_inert = pk.PPO_INERT[name][0]
        assert is_inert(SimpleNamespace(**{name: "disable_p2p_cache_shape", "pipeline_parallel_degree": 1}))
        assert not is_inert(SimpleNamespace(**{name: "disable_p2p_cache_shape", "pipeline_parallel_degree": 2}))


def test_every_training_argument_is_read_by_the_ppo_loop_or_in_a_table():
    sources = ppo_source()
    fields = {f.name for f in training_argument_fields()}
    unaccounted, inert_but_read = [], []
    for name in sorted(fields):
        where = [t for t, table in TABLES.items() if name in table]
        assert len(where) <= 1, f"{name} is in {where}: one table only"
        read_in = reads(sources, name)
        if not read_in and not where:
            unaccounted.append(name)
        if read_in and where == ["PPO_INERT"] and name not in INERT_ONLY_BELOW_PIPELINE_DEGREE_2:
            inert_but_read.append((name, where[0], read_in))
    assert not unaccounted, f"TrainingArguments fields neither read by the PPO loop nor in paddlenlp_keys' PPO tables: {unaccounted}"
    assert not inert_but_read, f"fields said not to act in PPO but read there: {inert_but_read}"
    for table_name, table in TABLES.items():
        stale = sorted(set(table) - fields)
        assert not stale, f"{table_name} names fields TrainingArguments does not have: {stale}"
    for name in ("report_to", "run_name", "save_strategy", "evaluation_strategy", "do_eval", "release_grads",
                 "sharding_parallel_config", "logging_first_step", "ignore_save_lr_and_optim", "fp16_opt_level", "amp_master_grad"):
        assert reads(sources, name), f"{name} is implemented by the PPO loop and must be read there"


def test_paddlenlp_defaults_are_the_values_the_loop_runs_with(tmp_path):
    from ppo.entry.ppo_arguments import PPOTrainingArguments

    defaults = {f.name: f.default for f in training_argument_fields()}
    for name, (accepted, _) in pk.PPO_FIXED_VALUE.items():
        assert pk.value_accepted(accepted, defaults[name]), name
    args = PPOTrainingArguments(output_dir=str(tmp_path))
    assert pk.ppo_value_problems(args) == [] and pk.inert_setting_messages(args) == []
    assert args.report_to == ["visualdl"] and not args.evaluates and args.saves_checkpoints and not args.release_gradients


@pytest.mark.parametrize(
    "accepted, value, ok",
    [
        ((False,), 0, True), ((False,), "false", True), ((False,), "true", False), ((False,), True, False), ((False,), 1, False),
        ((-1, 1), "1", True), ((-1, 1), 2, False), ((-1, 1), True, False), ((0.5,), "0.5", True), ((0.5,), "1", False),
        (("steps", "no"), "Steps", True), (("steps", "no"), "epoch", False), (("visualdl", "none"), ["visualdl"], True),
        (("visualdl", "none"), ["visualdl", "wandb"], False), (("visualdl",), [], True), ((), None, True), ((), "loss", False),
        (("",), {}, True), (("",), {"flash_attn": -1}, False),
    ],
)
def test_value_accepted(accepted, value, ok):
    assert pk.value_accepted(accepted, value) is ok


def parse_ppo(*argv):
    return parse_arguments(entry_classes("ppo"), list(argv))


def test_paddlenlp_ppo_and_grpo_files_resolve_these_keys(tmp_path):
    _, _, llama_ppo = parse_ppo(fixture("llama/ppo_argument.json"), "--output_dir", str(tmp_path))
    # evaluation_strategy no + do_eval 0 with eval_steps 10000: no evaluation, as in PaddleNLP
    assert llama_ppo.eval_steps == 10000 and not llama_ppo.evaluates
    assert llama_ppo.saves_checkpoints and llama_ppo.save_steps == 400  # save_strategy steps
    assert llama_ppo.release_gradients  # release_grads 1
    assert llama_ppo.report_to == ["visualdl"] and llama_ppo.run_name == str(tmp_path)  # PaddleNLP: run_name defaults to output_dir
    assert llama_ppo.ignore_save_lr_and_optim is False
    for name in ("llama/grpo_argument.json", "qwen/grpo_argument.json"):
        _, _, grpo = parse_ppo(fixture(name), "--output_dir", str(tmp_path))
        assert grpo.evaluates and grpo.eval_steps == 10  # do_eval 1, evaluation_strategy steps
        assert grpo.ignore_save_lr_and_optim and grpo.release_gradients
        messages = pk.inert_setting_messages(grpo)
        assert [m.split("=")[0] for m in messages] == ["pipeline_parallel_config"]  # at pipeline degree 1
    _, _, grpo_yaml = parse_ppo(yaml_without_unsupported("qwen/grpo_argument.yaml", tmp_path), "--output_dir", str(tmp_path))
    assert grpo_yaml.report_to == ["visualdl"] and grpo_yaml.run_name == "qwen2.5-7b-kk-dataset-grpo"
    assert grpo_yaml.evaluates and grpo_yaml.eval_steps == 20 and grpo_yaml.saves_checkpoints
    _, _, only_sharding_config = parse_ppo(yaml_without_unsupported("qwen/grpo_argument.yaml", tmp_path), "--output_dir", str(tmp_path),
                                           "--release_grads", "false")
    assert only_sharding_config.release_gradients  # sharding_parallel_config: enable_release_grads
    _, _, kept = parse_ppo(yaml_without_unsupported("qwen/grpo_argument.yaml", tmp_path), "--output_dir", str(tmp_path),
                           "--release_grads", "false", "--sharding_parallel_config", "")
    assert not kept.release_gradients
    inert = {m.split("=")[0] for m in pk.inert_setting_messages(grpo_yaml)}
    assert {"amp_custom_black_list", "amp_custom_white_list", "wandb_http_proxy"} <= inert


def yaml_without_unsupported(name, tmp_path):
    data = yaml.safe_load(open(fixture(name)))
    for key in YAML_UNSUPPORTED[name]:
        data.pop(key)
    path = tmp_path / os.path.basename(name)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_values_the_loop_does_not_run_are_refused_in_one_error_naming_each_key(tmp_path):
    with pytest.raises(ArgumentError) as info:
        parse_ppo(fixture("llama/ppo_argument.json"), "--output_dir", str(tmp_path), "--save_strategy", "epoch",
                  "--evaluation_strategy", "epoch", "--report_to", "autonlp", "--do_predict", "true",
                  "--optim", "adafactor")
    message = str(info.value)
    assert message.startswith("5 arguments cannot be used")
    for key, does in [("save_strategy: epoch", "saves a checkpoint at the end of every epoch"),
                      ("evaluation_strategy: epoch", "evaluates at the end of every epoch"),
                      ("report_to: autonlp", "Ray Tune"),
                      ("do_predict: true", "prediction"), ("optim: adafactor", "another optimizer")]:
        (line,) = [ln for ln in message.splitlines() if f"'{key}'" in ln]
        assert "is not supported here (PaddleNLP: " in line and does in line, line


def test_sft_rm_dpo_keep_these_keys_for_paddlenlp_s_trainer(tmp_path):
    _, _, sft = parse_arguments(entry_classes("sft"), ["--output_dir", str(tmp_path), "--save_strategy", "epoch",
                                                       "--evaluation_strategy", "epoch", "--optim", "adamw_mini"])
    assert sft.save_strategy.value == "epoch" and sft.evaluation_strategy.value == "epoch" and sft.do_eval


def test_amp_settings_the_loop_does_not_run_are_refused(tmp_path, monkeypatch):
    base = ["--output_dir", str(tmp_path)]
    with pytest.raises(ValueError, match="fp16_opt_level 'O1' with bf16/fp16: PaddleNLP's O1 autocasts"):
        parse_ppo(*base, "--bf16", "true", "--fp16_opt_level", "O1")
    _, _, args = parse_ppo(*base, "--fp16_opt_level", "O1")  # no AMP: inert in PaddleNLP too
    assert args.fp16_opt_level == "O1"
    with pytest.raises(ValueError, match="amp_master_grad .PaddleNLP: float32 gradients"):
        parse_ppo(*base, "--bf16", "true", "--fp16_opt_level", "O2", "--amp_master_grad", "true")
    from paddlenlp.trainer import integrations

    monkeypatch.setattr(integrations, "get_available_reporting_integrations", lambda: ["visualdl", "autonlp"])
    with pytest.raises(ValueError, match=r"report_to \['autonlp'\]: the PPO/GRPO loop reports to \['tensorboard', 'visualdl', 'wandb'\]"):
        parse_ppo(*base, "--report_to", "all")


# ---------------------------------------------------------------- the keys act in a 2-step GRPO run


def grpo_yaml_run(tiny_model_dir, tiny_data_dir, tmp_path, name, *flags):
    """PaddleNLP's Qwen GRPO YAML file (less its unsupported keys) at tiny sizes, scored by a rule
    in process: 2 steps. Returns (trainer, summary, output_dir)."""
    import tests.rule_reward_helpers  # noqa: F401  (registers test_rule_len)
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / name)
    trainer = build_trainer([
        yaml_without_unsupported("qwen/grpo_argument.yaml", tmp_path), *CPU_OVERRIDES, "--sequence_parallel", "false",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "2", "--max_length", "96", "--max_prompt_len", "80",
        "--max_dec_len", "6", "--min_dec_len", "1", "--rollout_n", "4", "--global_batch_size", "4",
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--num_sample_generations", "0",
        "--recompute", "false", "--use_rm_server", "false", "--use_rule_reward", "true", "--rule_reward_scorers", "test_rule_len",
        "--actor_model_name_or_path", tiny_model_dir, "--train_datasets", f"{tiny_data_dir}/prompts.jsonl",
        "--eval_datasets", f"{tiny_data_dir}/test.jsonl", *flags,
    ])
    return trainer, trainer.train(), out


def trainable_grads(model):
    return [p.grad for p in model.parameters() if not p.stop_gradient]


def test_release_grads_no_save_no_eval_report_to_none(tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="ppo"):
        trainer, summary, out = grpo_yaml_run(
            tiny_model_dir, tiny_data_dir, tmp_path, "released", "--report_to", "none", "--save_strategy", "no",
            "--evaluation_strategy", "no", "--do_eval", "false",
        )
    assert trainer.learner.steps.release_gradients
    grads = trainable_grads(trainer.passes.models.actor)
    assert grads and all(g is None for g in grads)  # release_grads: freed after the step, not zeroed
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and not any(k.startswith("eval/") for r in rows for k in r)  # no evaluation
    assert not [d for d in os.listdir(out) if d.startswith("checkpoint-")]  # save_strategy no
    assert os.path.isfile(os.path.join(out, "policy", "config.json"))  # the final model is still written
    assert not os.path.exists(f"{out}/vdl")  # report_to none: metrics.jsonl only
    assert summary["run_name"] == json.load(open(f"{out}/summary.json"))["run_name"] == "qwen2.5-7b-kk-dataset-grpo"
    inert = [r.getMessage() for r in caplog.records if "does nothing in the PPO/GRPO loop" in r.getMessage()]
    assert len([m for m in inert if m.startswith("amp_custom_black_list=")]) == 1  # logged once
    assert any(m.startswith("wandb_http_proxy=") and "WANDB_HTTPS_PROXY" in m for m in inert)


def test_kept_grads_checkpoints_eval_and_visualdl(tiny_model_dir, tiny_data_dir, tmp_path):
    trainer, summary, out = grpo_yaml_run(
        tiny_model_dir, tiny_data_dir, tmp_path, "kept", "--release_grads", "false", "--sharding_parallel_config", "",
        "--save_steps", "1", "--eval_steps", "1", "--logging_steps", "5", "--logging_first_step", "true",
        "--ignore_save_lr_and_optim", "true", "--run_name", "tiny-grpo",
    )
    grads = trainable_grads(trainer.passes.models.actor)
    assert grads and all(g is not None and float(abs(g).sum()) == 0.0 for g in grads)  # zeroed, kept
    rows = metrics(out)
    assert [r["step"] for r in rows if "eval/score" in r] == [0, 1, 2]  # evaluation_strategy steps, eval_steps 1
    assert [r["step"] for r in rows if "objective/scores" in r] == [1, 2]  # logging_first_step, then the last step
    checkpoints = sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-1", "checkpoint-2"]
    for c in checkpoints:  # ignore_save_lr_and_optim: no optimizer states
        files = os.listdir(os.path.join(out, c))
        assert not [f for f in files if f.endswith(".pdopt")]
        assert json.load(open(os.path.join(out, c, "trainer_state.json")))["optimizer_states"] is False
    assert os.listdir(f"{out}/vdl") and summary["run_name"] == "tiny-grpo"
    resumed, _, _ = grpo_yaml_run(
        tiny_model_dir, tiny_data_dir, tmp_path, "kept", "--release_grads", "false", "--sharding_parallel_config", "",
        "--max_steps", "3", "--overwrite_output_dir", "false", "--save_steps", "1", "--eval_steps", "1",
    )
    assert resumed.state.step == 3 and [r["step"] for r in metrics(out) if "objective/scores" in r][-1] == 3


def test_readme_names_every_ppo_table_entry():
    section = open(os.path.join(ROOT, "docs", "paddlenlp.md")).read()
    part = section[section.index("**PaddleNLP's `TrainingArguments` in PPO/GRPO.**"):]
    implemented = ["report_to", "run_name", "save_strategy", "evaluation_strategy", "do_eval", "release_grads",
                   "enable_release_grads", "logging_first_step", "ignore_save_lr_and_optim", "fp16_opt_level", "amp_master_grad"]
    missing = [k for k in [*pk.PPO_FIXED_VALUE, *pk.PPO_INERT, *pk.PPO_BY_PADDLENLP, *implemented] if f"`{k}" not in part]
    assert not missing, f"docs/paddlenlp.md lacks {missing}"


def test_values_set_in_code_are_checked_after_parsing_too(tmp_path):
    from ppo.entry.ppo_arguments import PPOTrainingArguments

    with pytest.raises(ValueError) as info:
        PPOTrainingArguments(output_dir=str(tmp_path), save_strategy="epoch", report_to="autonlp", use_async_save=True)
    message = str(info.value)
    for key in ("'save_strategy: epoch'", "'report_to: ['autonlp']'", "'use_async_save: True'"):
        assert key in message, key
