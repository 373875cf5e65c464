"""Rotary settings of Hugging Face configs in both layouts (`ppo/models/hf_rope.py`): transformers 4's
top-level `rope_theta` / `rope_scaling` and transformers 5's `rope_parameters`. Tiny Llama and
Qwen2 models (plain, linear and llama3 rotary scaling) exported in each layout import to the same
model bit for bit; what PaddleNLP's models do not compute (rope types, `partial_rotary_factor`,
windows in use, contradicting fields) is refused by name before any weight is read; and, where a
Python with transformers is found, checkpoints written by transformers itself import with its
logits and their exports load back in transformers with the same logits."""
import json
import os
import shutil

import numpy as np
import pytest

from ppo.models import hf_files, hf_rope
from ppo.models.hf_convert import export_model
from ppo.models.hf_import import load_hf_model
from tests.hf_weights_helpers import LONG_IDS, causal_logits, hf_python, run_transformers, tiny_model

KINDS = [("llama", None), ("llama", "linear"), ("llama", "llama3"), ("qwen2", None)]
TRANSFORMERS_ATOL = 1e-4  # float32, torch vs Paddle kernels (the bound; measured below in the test)


def write_config(path, config):
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


@pytest.mark.parametrize("kind,rope", KINDS)
def test_a_transformers5_config_imports_with_its_rope_settings(tmp_path, kind, rope):
    """The config rewritten by hand the way transformers 5 saves it (`rope_parameters`, no top-level
    `rope_theta` / `rope_scaling`): the import computes the exported model's logits exactly; reading
    no theta would build a rope_theta 10,000 model (the tiny configs use 5,000)."""
    model = tiny_model(kind, rope=rope)
    config = export_model(model, str(tmp_path))
    assert config["rope_theta"] == 5000.0
    scaling = dict(config.get("rope_scaling") or {})
    v5 = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling", "rope_parameters")}
    v5["rope_parameters"] = {"rope_theta": 5000.0, "rope_type": scaling.pop("rope_type", "default"), **scaling}
    write_config(str(tmp_path), v5)
    back = load_hf_model(str(tmp_path))
    assert back.config.rope_theta == 5000.0
    np.testing.assert_array_equal(causal_logits(back, ids=LONG_IDS), causal_logits(model, ids=LONG_IDS))


@pytest.mark.parametrize("kind,rope", KINDS)
def test_both_layouts_import_to_the_same_model(tmp_path, kind, rope):
    model = tiny_model(kind, rope=rope)
    expected = causal_logits(model, ids=LONG_IDS)
    written = {}
    for layout in hf_rope.LAYOUTS:
        written[layout] = export_model(model, str(tmp_path / layout), layout=layout)
        back = load_hf_model(str(tmp_path / layout))
        np.testing.assert_array_equal(causal_logits(back, ids=LONG_IDS), expected, err_msg=layout)
        assert export_model(back, str(tmp_path / f"{layout}-again"), layout=layout) == written[layout]
    v4, v5, both = written["transformers4"], written["transformers5"], written["both"]
    assert "rope_parameters" not in v4 and v4["rope_theta"] == 5000.0
    assert "rope_theta" not in v5 and "rope_scaling" not in v5 and v5["rope_parameters"]["rope_theta"] == 5000.0
    assert v5["rope_parameters"]["rope_type"] == (rope or "default")
    assert both == {**v4, **v5}
    assert hf_rope.with_layout(v5, "transformers4") == v4 and hf_rope.with_layout(v4, "transformers5") == v5


R = {"rope_theta": 1e6}
L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 16}


@pytest.mark.parametrize("config,model_type,fields", [
    ({}, "qwen2", {"rope_theta": 10000.0}),  # transformers' own default when no layout names one
    (R, "qwen2", R),
    ({"rope_parameters": {**R, "rope_type": "default"}}, "qwen2", R),
    ({**R, "rope_parameters": {**R, "rope_type": "default"}, "rope_scaling": None}, "qwen2", R),
    ({**R, "rope_scaling": {"type": "linear", "factor": 2}}, "llama",
     {**R, "rope_scaling_type": "linear", "rope_scaling_factor": 2.0}),
    ({"rope_parameters": {**R, **L3}}, "llama", {**R, "rope_scaling": L3}),
    ({**R, "rope_scaling": dict(L3, original_max_position_embeddings=None), "max_position_embeddings": 16},
     "llama", {**R, "rope_scaling": L3}),  # transformers 5 fills it from max_position_embeddings
    ({"rope_parameters": {"full_attention": {**R, "rope_type": "default"}}}, "qwen2", R),
    ({**R, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0, "num_hidden_layers": 2,
      "max_position_embeddings": 64}, "qwen2", R),  # a window as long as the model masks nothing
    ({**R, "use_sliding_window": False, "sliding_window": 4, "layer_types": ["sliding_attention"]}, "qwen2", R),
])
def test_either_layout_normalises_to_the_paddlenlp_fields(config, model_type, fields):
    assert hf_rope.normalise(config, model_type) == (fields, [])


@pytest.mark.parametrize("config,model_type,named", [
    ({"rope_parameters": {**R, "rope_type": "yarn", "factor": 4.0}}, "qwen2", "rope_type 'yarn'"),
    ({"rope_parameters": {**R, "rope_type": "linear", "factor": 4.0}}, "qwen2", "rope_type 'linear'"),
    ({**R, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "llama", "rope_type 'dynamic'"),
    ({**R, "rope_scaling": {"rope_type": "longrope"}}, "llama", "rope_type 'longrope'"),
    ({"rope_parameters": {**R, "rope_type": "linear"}}, "llama", "without factor"),
    ({"rope_parameters": {**R, "partial_rotary_factor": 0.5}}, "llama", "partial_rotary_factor 0.5"),
    ({**R, "partial_rotary_factor": 0.25}, "qwen2", "partial_rotary_factor 0.25"),
    ({**R, "rope_parameters": {"rope_theta": 1e4}}, "qwen2", "rope_theta given differently"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_parameters": {"rope_type": "default"}},
     "llama", "rope_type given differently"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_parameters": {"rope_type": "linear", "factor": 4}},
     "llama", "rope_scaling.factor=2.0 but rope_parameters.factor=4"),
    ({"rope_parameters": {**R, **L3}, "original_max_position_embeddings": 32}, "llama",
     "original_max_position_embeddings 32"),
    ({"rope_parameters": {"full_attention": R, "sliding_attention": {"rope_theta": 1e4}}}, "qwen2",
     "per layer type differ"),
    ({"rope_theta": "1e6"}, "qwen2", "rope_theta '1e6'"),
    ({**R, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, "num_hidden_layers": 2,
      "max_position_embeddings": 64}, "qwen2", "sliding_window 4 in layers [1]"),
    ({**R, "use_sliding_window": True, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"],
      "max_position_embeddings": 64}, "qwen2", "sliding_window 8 in layers [1]"),
])
def test_what_paddlenlp_does_not_compute_is_refused_by_name(config, model_type, named):
    _, problems = hf_rope.normalise(config, model_type)
    assert len(problems) == 1 and named in problems[0], problems


def test_a_refused_config_stops_before_the_weights_and_in_the_start_up_checks(tmp_path, capsys, monkeypatch,
                                                                             tiny_data_dir):
    from ppo.common.argument_problems import ArgumentError
    from ppo.models.hf_import import hf_config_problems
    from scripts.import_hf import main as import_main
    from sft.run_sft import main as run_sft

    hf = str(tmp_path / "hf")
    config = export_model(tiny_model("qwen2"), hf, layout="transformers5")
    write_config(hf, {**config, "rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}})
    with monkeypatch.context() as patch:
        patch.setattr(hf_files, "read_safetensors", lambda path: pytest.fail("weights read before the refusal"))
        with pytest.raises(ValueError, match="rope_type 'yarn'"):
            load_hf_model(hf)
    (problem,) = hf_config_problems([("model_name_or_path", hf), ("other", str(tmp_path))])
    assert problem.startswith(f"model_name_or_path: {hf}/config.json: ") and "rope_type 'yarn'" in problem
    with pytest.raises(SystemExit) as stop:
        import_main(["--hf_path", hf, "--output_dir", str(tmp_path / "ours")])
    assert stop.value.code == 2
    assert "rope_type 'yarn'" in capsys.readouterr().err and not os.path.exists(tmp_path / "ours")
    with pytest.raises(ArgumentError) as stop:  # an entry point's start-up checks, before any model loads
        run_sft(["config/tiny/sft_argument.json", "--model_name_or_path", hf, "--output_dir", str(tmp_path / "sft"),
                 "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl",
                 "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl"])
    assert str(stop.value) == problem and not os.path.exists(tmp_path / "sft" / "config.json")


def test_the_export_script_writes_the_layout_asked_for(tmp_path, tiny_model_dir):
    from scripts.export_hf import main as export_main

    for layout, keys in (("transformers5", {"rope_parameters"}), ("transformers4", {"rope_theta", "rope_scaling"}),
                         (None, {"rope_parameters", "rope_theta", "rope_scaling"})):
        out = str(tmp_path / str(layout))
        export_main(["--model_path", tiny_model_dir, "--output_dir", out] + (["--config_layout", layout] if layout else []))
        config = json.load(open(os.path.join(out, "config.json")))
        assert {k for k in config if k.startswith("rope")} == keys, layout
        assert hf_rope.read_rope(config) == (hf_rope.Rope(theta=10000.0), []), layout


BUILD = {  # transformers config kwargs (the legacy names, which transformers 4 and 5 both take)
    "llama": dict(model_type="llama", rope_theta=5000.0, tie_word_embeddings=False),
    "llama-linear": dict(model_type="llama", rope_theta=5000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "llama-llama3": dict(model_type="llama", rope_theta=5000.0, rope_scaling=L3),
    "qwen2": dict(model_type="qwen2", rope_theta=1e6, tie_word_embeddings=True, use_sliding_window=False,
                  sliding_window=4, max_window_layers=1),
}
SIZES = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)


def other_layout_copy(src, dst):
    """`src` (a transformers-written directory) with its config rewritten in the other layout."""
    shutil.copytree(src, dst)
    config = json.load(open(os.path.join(src, "config.json")))
    layout = "transformers4" if "rope_parameters" in config else "transformers5"
    write_config(dst, hf_rope.with_layout(config, layout))
    return "rope_parameters" in config


@pytest.mark.skipif(hf_python() is None, reason="no Python with torch and transformers (set PADDLE_ALIGN_HF_PYTHON)")
def test_transformers_checkpoints_of_either_layout_import_and_export_exactly(tmp_path):
    long = {"input_ids": LONG_IDS.tolist(), "attention_mask": np.ones_like(LONG_IDS).tolist()}
    jobs = [{"kind": "build", "dir": str(tmp_path / name), "config": {**SIZES, **kw}, "seed": i, **long}
            for i, (name, kw) in enumerate(BUILD.items())]
    outs = run_transformers(jobs, tmp_path)
    built = {name: out["logits"] for name, out in zip(BUILD, outs)}
    five = int(str(outs[0]["version"]).split(".")[0]) >= 5  # transformers 4 reads no rope_parameters
    back_jobs, worst = [], 0.0
    for name in BUILD:
        src = str(tmp_path / name)
        assert other_layout_copy(src, src + "-other") == five  # what transformers wrote, then the other layout
        for variant in (src, src + "-other"):
            model = load_hf_model(variant)
            ours = causal_logits(model, ids=LONG_IDS)
            worst = max(worst, float(np.abs(ours - built[name]).max()))
            assert np.abs(ours - built[name]).max() <= TRANSFORMERS_ATOL, variant
            np.testing.assert_array_equal(ours, causal_logits(load_hf_model(src), ids=LONG_IDS))
            for layout in hf_rope.LAYOUTS if five else ("both", "transformers4"):
                export_model(model, f"{variant}-export-{layout}", layout=layout)
                back_jobs.append({"kind": "causal", "dir": f"{variant}-export-{layout}", "name": name, **long})
        if five:
            back_jobs.append({"kind": "causal", "dir": src + "-other", "name": name, **long})
    print(f"max |logit difference| Paddle vs transformers {outs[0]['version']}: {worst:.2e}")
    (tmp_path / "back").mkdir()
    for job, out in zip(back_jobs, run_transformers(back_jobs, tmp_path / "back")):
        np.testing.assert_array_equal(out["logits"], built[job["name"]], err_msg=job["dir"])
