"""Bad input to the scripts that load models, refused before any model loads with one line naming
the file, key or tensor, exit status 2, no traceback: `scripts/evaluate.py` on an empty data file
or a judge without its model, a GRPO run's judge scorer with a missing model or an unknown
template, `scripts/import_hf.py` on a cut-short `model.safetensors`, an architecture it does not
import or missing tensors, and a reward-model audit whose tokenizer outgrows the embedding."""
import json
import os
import shutil
import sys

import pytest

from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_LOADED = "Loading weights file"  # PaddleNLP's line when a model's weights load


def run_script(*args):
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    return warm_python.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=1200)


def refusal(done, *never_made):
    """The one error line of a refused run (asserting exit 2, no traceback, no model loaded, no output)."""
    assert done.returncode == 2, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stderr + done.stdout and MODEL_LOADED not in done.stdout + done.stderr
    assert not any(os.path.exists(path) for path in never_made)
    assert done.stderr.count("error:") == 1, done.stderr[-3000:]  # (log lines of the data may come before it)
    return done.stderr.strip().splitlines()[-1]


def test_evaluate_on_an_empty_data_file(tiny_model_dir, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "eval.json"
    done = run_script("scripts/evaluate.py", "--model", tiny_model_dir, "--data", str(empty), "--output", str(out))
    assert refusal(done, out) == (f"evaluate.py: error: {empty}: PromptOnlyDataset has no samples: the data holds no "
                                  "records")


def test_evaluate_with_a_judge_whose_model_is_not_there(tiny_model_dir, tiny_data_dir, tmp_path):
    missing, out = str(tmp_path / "judge"), tmp_path / "eval.json"
    verifier = json.dumps({"judge": {"model": missing, "template": "tiny"}})
    done = run_script("scripts/evaluate.py", "--model", tiny_model_dir, "--data", f"{tiny_data_dir}/test.jsonl",
                      "--verifier", verifier, "--output", str(out))
    assert refusal(done, out).startswith(
        f"evaluate.py: error: --verifier/--weights/--ks: scorer 'judge': option model={missing}: no such directory")


def grpo_with_scorers(tmp_path, model_dir, data_dir, scorers):
    config = json.load(open(os.path.join(ROOT, "config/tiny/grpo_rule_argument.json")))
    config.update(actor_model_name_or_path=model_dir, train_datasets=f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
                  eval_datasets=f"Jsonfile:1.0:{data_dir}/test.jsonl", output_dir=str(tmp_path / "out"),
                  logging_dir=str(tmp_path / "out" / "vdl"), rule_reward_scorers=json.dumps(scorers))
    path = tmp_path / "grpo.json"
    path.write_text(json.dumps(config))
    return run_script("ppo/run_ppo.py", str(path))


def test_grpo_with_a_judge_scorer_whose_model_is_not_there(tiny_model_dir, tiny_data_dir, tmp_path):
    missing = "judges/not_trained"  # no `judges` folder: PaddleNLP would take it for a model-hub name
    done = grpo_with_scorers(tmp_path, tiny_model_dir, tiny_data_dir, {"judge": {"model": missing, "template": "tiny"}})
    assert refusal(done, tmp_path / "out") == (
        "run_ppo.py: error: rule_reward_scorers / rule_reward_weights: scorer 'judge': option model=judges/not_trained: "
        "no such directory (the judge loads a local model directory or LoRA adapter)")


def test_grpo_with_a_judge_template_that_does_not_exist(tiny_model_dir, tiny_data_dir, tmp_path):
    done = grpo_with_scorers(tmp_path, tiny_model_dir, tiny_data_dir, {"judge": {"model": tiny_model_dir, "template": "tinyy"}})
    assert refusal(done, tmp_path / "out") == (
        "run_ppo.py: error: rule_reward_scorers / rule_reward_weights: scorer 'judge': option template: judge template "
        "'tinyy' is neither a built-in name (correct, correct_with_reference, score, better, tiny, tiny_better, "
        "tiny_reference) nor a text with {question} and {answer} (or {answer_a} and {answer_b})")


@pytest.fixture(scope="module")
def hf_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model exported as a Hugging Face directory (one `model.safetensors`)."""
    from scripts.export_hf import main as export_main

    path = str(tmp_path_factory.mktemp("hf") / "hf")
    export_main(["--model_path", tiny_model_dir, "--output_dir", path])
    return path


def broken_copy(hf_dir, tmp_path, config_change=None, drop=(), cut_bytes=0):
    """A copy of `hf_dir` with `config_change` applied to its config, tensors `drop` left out, or
    its weight file's last `cut_bytes` bytes cut off."""
    from ppo.models.hf_files import read_safetensors, write_safetensors

    path = str(tmp_path / "broken")
    shutil.copytree(hf_dir, path)
    if config_change:
        config = json.load(open(os.path.join(path, "config.json")))
        config.update(config_change)
        json.dump(config, open(os.path.join(path, "config.json"), "w"))
    if drop:
        tensors = {k: v.copy() for k, v in read_safetensors(path).items() if k not in drop}
        write_safetensors(tensors, path)
    if cut_bytes:
        weights = os.path.join(path, "model.safetensors")
        with open(weights, "r+b") as f:
            f.truncate(os.path.getsize(weights) - cut_bytes)
    return path


def test_import_hf_names_a_cut_short_weight_file(hf_dir, tmp_path):
    path = broken_copy(hf_dir, tmp_path, cut_bytes=100)
    size = os.path.getsize(os.path.join(path, "model.safetensors"))
    done = run_script("scripts/import_hf.py", "--hf_path", path, "--output_dir", str(tmp_path / "out"))
    line = refusal(done, tmp_path / "out")
    assert line == (f"import_hf.py: error: hf_path: weight file {path}/model.safetensors is cut short ({size} bytes, "
                    f"its header needs {size + 100}); re-save or re-copy the model")


def every_family_architecture():
    """The causal-LM then the score-model class names of every family in the family table."""
    from ppo.common.model_families import FAMILIES

    return [f.causal_lm_arch for f in FAMILIES.values()] + [f.score_arch for f in FAMILIES.values()]


def test_import_hf_names_an_architecture_it_does_not_build(hf_dir, tmp_path):
    path = broken_copy(hf_dir, tmp_path, config_change={"architectures": ["LlamaForTokenClassification"]})
    done = run_script("scripts/import_hf.py", "--hf_path", path, "--output_dir", str(tmp_path / "out"))
    assert refusal(done, tmp_path / "out") == (
        f"import_hf.py: error: hf_path: {path}/config.json: architectures ['LlamaForTokenClassification'] is not "
        f"imported here; supported: {', '.join(every_family_architecture())}")


def test_import_hf_names_the_missing_tensors(hf_dir, tmp_path):
    gone = ["model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    path = broken_copy(hf_dir, tmp_path, drop=gone)
    done = run_script("scripts/import_hf.py", "--hf_path", path, "--output_dir", str(tmp_path / "out"))
    assert refusal(done, tmp_path / "out") == (
        f"import_hf.py: error: hf_path={path}: 2 tensors missing for ['LlamaForCausalLM']: "
        "model.layers.0.mlp.down_proj.weight, model.norm.weight")


def test_a_reward_model_audit_whose_tokenizer_outgrows_the_embedding(tiny_rm_dir, tiny_data_dir, tmp_path):
    from ppo.models.loading import load_tokenizer

    path = str(tmp_path / "rm")
    shutil.copytree(tiny_rm_dir, path)
    tokenizer = load_tokenizer(path)
    tokenizer.add_tokens(["<extra_a>", "<extra_b>"])
    tokenizer.save_pretrained(path)
    vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
    top = max(load_tokenizer(path).get_vocab().values())
    assert top >= vocab
    data = tmp_path / "test.jsonl"  # the held-out prompts, one answer using a token past the embedding
    data.write_text(open(f"{tiny_data_dir}/test.jsonl").read() + json.dumps({"src": "Reverse: ab", "tgt": "b<extra_b>"}) + "\n")
    done = run_script("rm/audit_reward.py", "--model_name_or_path", path, "--eval_datasets", f"Jsonfile:1.0:{data}",
                      "--output_dir", str(tmp_path / "out"))
    assert refusal(done, tmp_path / "out") == (
        f"audit_reward.py: error: model_name_or_path={path}: the tokenizer produces ids up to {top} but the model's "
        f"embedding has {vocab} rows (vocab_size); resize the embedding or use the model's own tokenizer")


def test_expert_parallel_refusals_name_the_key_before_a_model_loads(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "grpo")
    done = run_script("ppo/run_ppo.py", "config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", tiny_model_dir,
                      "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl", "--output_dir", out,
                      "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer", "--expert_parallel_degree", "1",
                      "--use_expert_parallel", "true")
    assert refusal(done, f"{out}/policy").endswith(
        "use_expert_parallel: true needs expert_parallel_degree > 1 (the ranks the experts are split over)")
    done = run_script("sft/run_sft.py", "config/tiny/sft_argument.json", "--model_name_or_path", tiny_model_dir,
                      "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl", "--output_dir", out,
                      "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--expert_parallel_degree", "2")
    refusal(done, f"{out}/model_state.pdparams")
    lines = [line.strip() for line in done.stderr.strip().splitlines()[-2:]]
    assert lines == ["expert_parallel_degree 2 does not divide the world size 1 (the launched processes)",
                     f"expert_parallel_degree 2: model_name_or_path {tiny_model_dir} is a dense model (llama, no experts)"]
    done = run_script("dpo/run_online_dpo.py", "config/tiny/online_dpo_argument.json", "--actor_model_name_or_path",
                      tiny_model_dir, "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl", "--output_dir", out,
                      "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--expert_parallel_degree", "2")
    assert refusal(done, f"{out}/policy").endswith(
        "expert_parallel_degree 2: this entry point does not run expert parallelism (SFT, PPO and GRPO do); set it to 1")
