"""Our families' pipeline classes (`ppo/strategy/pipeline/family_pipes.py`) at pp_degree=1 equal the
plain models from the same checkpoint, bit for bit: logits (score-model pipe: scores) on a padded
batch and every parameter's gradient, tied and untied heads, and with full recompute. The cases run in one process of
tests/family_pipe_pp1_worker.py (`fleet.init` is process-global). Also: which model types have a
pipeline class, and the mixture-of-experts families refused by name."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ppo.strategy.pipeline.pipe import pipe_classes, pipe_model_types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ("qwen3", "qwen3:untied", "ernie45", "ernie45:untied", "qwen3:score", "ernie45:score", "ernie45:recompute")


@pytest.fixture(scope="module")
def pp1_results(tmp_path_factory):
    env = dict(os.environ, PYTHONPATH=REPO, MKL_DEBUG_CPU_TYPE="5")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "family_pipe_pp1_worker.py"),
                           str(tmp_path_factory.mktemp("family_pp1")), *CASES], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    results = {}
    for line in proc.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("RESULT", "FAILED"):
            case, _, text = rest.partition(" ")
            results[case] = (kind, text)
    assert proc.returncode == 0 and set(results) == set(CASES), proc.stdout[-2000:] + proc.stderr[-3000:]
    return results


@pytest.mark.parametrize("case", CASES)
def test_family_pipe_pp1_equals_plain_model(pp1_results, case):
    kind, text = pp1_results[case]
    assert kind == "RESULT", text
    res = json.loads(text)
    arch, _, variant = case.partition(":")
    name = {"qwen3": "Qwen3", "ernie45": "Ernie4_5"}[arch]
    assert res["pipe_class"] == (f"{name}ModelForScorePipe" if variant == "score" else f"{name}ForCausalLMPipe")
    assert res["shape"][:2] == [2, 12] and (variant == "score" or res["shape"][2] > 100)
    assert res["out_diff"] == 0.0 and res["grad_diff"] == 0.0
    assert res["n_grads"] > 10 and res["grad_max"] > 0
    # one stage holds the embedding and the tied head: one parameter, as in the plain model
    assert res["missing_keys"] == (["lm_head.weight"] if variant in ("", "recompute") else []) and res["extra_keys"] == []
    assert res["recomputed_layers"] == (2 if variant == "recompute" else 0)  # each decoder layer once


def test_pipeline_model_types():
    from ppo.models.families.qwen3_modeling import Qwen3Config

    assert pipe_model_types() == ["ernie4_5", "llama", "qwen2", "qwen3"]
    assert pipe_classes(Qwen3Config(tie_word_embeddings=True))[1] == "Qwen3ForCausalLM"
    with pytest.raises(ValueError, match=r"no pipeline class for model_type 'gpt'; supported: \['ernie4_5', 'llama'"):
        pipe_classes(SimpleNamespace(model_type="gpt"))


@pytest.mark.parametrize("model_type", ["qwen3_moe", "ernie4_5_moe", "qwen2_moe", "mixtral"])
def test_mixture_of_experts_refused_by_name(model_type):
    with pytest.raises(ValueError, match=f"pipeline_parallel_degree > 1 is not implemented for model_type '{model_type}'"):
        pipe_classes(SimpleNamespace(model_type=model_type))
