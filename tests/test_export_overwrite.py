"""scripts/export_hf.py never replaces a model it did not write: a directory holding another
model (a reward model's copy) is refused in one line, exit status 2, before the model loads and
with every file left as it was, unless --overwrite, which then removes that model's files; an
earlier export is replaced (its stale shards removed); --model_path itself, or the base model of
an adapter, is refused even with --overwrite."""
import hashlib
import json
import os
import shutil

import pytest

from ppo.models import export_target, hf_convert
from scripts.export_hf import main as export_main


def snapshot(path):
    """name -> sha256 of every file under `path`."""
    return {os.path.relpath(os.path.join(root, f), path): hashlib.sha256(open(os.path.join(root, f), "rb").read()).hexdigest()
            for root, _, files in os.walk(path) for f in files}


def refused(capsys, monkeypatch, argv):
    """Run the export expecting a refusal before any model loads; returns the stderr text."""
    def no_load(path):
        raise AssertionError(f"the model {path} was loaded before the refusal")

    monkeypatch.setattr(hf_convert, "load_plain_model", no_load)
    with pytest.raises(SystemExit) as stop:
        export_main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_reward_model_copy_is_refused_then_replaced_with_overwrite(tmp_path, tiny_model_dir, tiny_rm_dir, capsys,
                                                                     monkeypatch):
    target = str(tmp_path / "rm_copy")
    shutil.copytree(tiny_rm_dir, target)
    before = snapshot(target)
    argv = ["--model_path", tiny_model_dir, "--output_dir", target]
    err = refused(capsys, monkeypatch, argv)
    assert f"output_dir={target} holds a model that is not an earlier export of this script" in err
    assert "config.json" in err and "model_state.pdparams" in err and "--overwrite" in err
    assert snapshot(target) == before  # nothing written, nothing removed
    monkeypatch.undo()
    export_main(argv + ["--overwrite"])
    names = set(os.listdir(target))
    assert "model_state.pdparams" not in names and {"model.safetensors", "config.json", export_target.MARKER} <= names
    assert json.load(open(f"{target}/config.json"))["architectures"] == ["LlamaForCausalLM"]
    marker = json.load(open(f"{target}/{export_target.MARKER}"))
    assert marker["model_path"] == os.path.abspath(tiny_model_dir)
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json"} <= set(marker["files"])


def test_an_earlier_export_is_replaced_without_overwrite_and_leaves_no_stale_shard(tmp_path, tiny_model_dir):
    out = str(tmp_path / "hf")
    export_main(["--model_path", tiny_model_dir, "--output_dir", out, "--max_shard_size", "20000"])
    shards = sorted(n for n in os.listdir(out) if n.startswith("model-"))
    assert len(shards) > 1 and os.path.isfile(f"{out}/model.safetensors.index.json")
    with open(f"{out}/notes.txt", "w") as f:  # not a model file: kept
        f.write("mine")
    export_main(["--model_path", tiny_model_dir, "--output_dir", out])  # one file now
    names = set(os.listdir(out))
    assert not any(n.startswith("model-") for n in names) and "model.safetensors.index.json" not in names
    assert {"model.safetensors", "notes.txt"} <= names
    assert "model.safetensors.index.json" not in json.load(open(f"{out}/{export_target.MARKER}"))["files"]


def test_a_model_file_added_beside_an_export_makes_it_foreign(tmp_path, tiny_model_dir, capsys, monkeypatch):
    out = str(tmp_path / "hf")
    export_main(["--model_path", tiny_model_dir, "--output_dir", out])
    shutil.copyfile(f"{tiny_model_dir}/model_state.pdparams", f"{out}/model_state.pdparams")
    err = refused(capsys, monkeypatch, ["--model_path", tiny_model_dir, "--output_dir", out])
    assert "(model_state.pdparams)" in err


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_the_model_path_itself_is_refused_even_with_overwrite(tmp_path, tiny_model_dir, capsys, monkeypatch, overwrite):
    before = snapshot(tiny_model_dir)
    err = refused(capsys, monkeypatch, ["--model_path", tiny_model_dir, "--output_dir", tiny_model_dir + "/", *overwrite])
    assert f"is --model_path: the export would replace the model it reads" in err
    assert "--overwrite does not allow this" in err
    assert snapshot(tiny_model_dir) == before


def test_the_base_model_of_an_adapter_is_refused_even_with_overwrite(tmp_path):
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    base.mkdir()
    adapter.mkdir()
    (base / "config.json").write_text("{}")
    (adapter / "lora_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    problems = export_target.export_target_problems(str(base), str(adapter), overwrite=True)
    assert problems == [f"output_dir={base} is the base model {base} of the adapter --model_path: the export would "
                        "replace the model it reads; choose another output_dir (--overwrite does not allow this)"]
    assert export_target.export_target_problems(str(tmp_path / "new"), str(adapter), overwrite=False) == []
