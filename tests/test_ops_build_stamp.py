"""csrc/build_ops.py's build stamp is keyed on source contents and names relative to csrc/: a
build stamped in one checkout stays up to date when the checkout is moved or copied (re-cloned),
and goes stale when a source's content or name changes."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(REPO, "csrc")


def _copy_csrc(dst_root):
    """A checkout's csrc/ without build outputs, under dst_root/csrc."""
    dst = os.path.join(dst_root, "csrc")
    shutil.copytree(CSRC, dst, ignore=shutil.ignore_patterns("build", "__pycache__"))
    return dst


def _load(csrc_dir, tag):
    spec = importlib.util.spec_from_file_location(f"_build_ops_{tag}", os.path.join(csrc_dir, "build_ops.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stamp_fake_build(mod):
    """Stamp a library as build() does after compiling (the .so content is irrelevant to the stamp)."""
    os.makedirs(mod.LIB_DIR, exist_ok=True)
    with open(mod.LIB_PATH, "wb") as f:
        f.write(b"\x7fELF stand-in")
    mod.write_stamp(mod.current_stamp())


def test_stamp_survives_moving_the_checkout(tmp_path):
    first = _copy_csrc(str(tmp_path / "first"))
    mod = _load(first, "first")
    assert not mod.is_up_to_date()  # nothing built yet
    _stamp_fake_build(mod)
    assert mod.is_up_to_date()
    with open(mod.STAMP_PATH) as f:
        text = f.read()
    assert str(tmp_path) not in text and "/csrc/" not in text, "the stamp must not record paths"
    assert len(json.loads(text)["sources_sha256"]) == 64

    moved_root = str(tmp_path / "elsewhere" / "moved")
    shutil.move(str(tmp_path / "first"), moved_root)
    moved = _load(os.path.join(moved_root, "csrc"), "moved")
    assert moved.LIB_PATH.startswith(moved_root)
    assert moved.is_up_to_date(), "a moved checkout must keep its fresh build"

    # the command-line check agrees (exit 0 = up to date)
    proc = subprocess.run([sys.executable, os.path.join(moved_root, "csrc", "build_ops.py"), "--check"],
                          capture_output=True, text=True, env={**os.environ, "MKL_DEBUG_CPU_TYPE": "5"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up to date" in proc.stdout


def test_stamp_survives_a_copy_with_the_build(tmp_path):
    """A second clone that received the build directory (e.g. copied with the checkout)."""
    first = _copy_csrc(str(tmp_path / "a"))
    _stamp_fake_build(_load(first, "a"))
    shutil.copytree(str(tmp_path / "a"), str(tmp_path / "b"))
    assert _load(os.path.join(str(tmp_path / "b"), "csrc"), "b").is_up_to_date()


@pytest.mark.parametrize("change", ["content", "rename", "new_file"])
def test_stamp_goes_stale_when_sources_change(tmp_path, change):
    csrc = _copy_csrc(str(tmp_path))
    mod = _load(csrc, f"change_{change}")
    _stamp_fake_build(mod)
    assert mod.is_up_to_date()
    src = os.path.join(csrc, "cpu", "swiglu.cc")
    if change == "content":
        with open(src, "a") as f:
            f.write("\n// edited\n")
    elif change == "rename":
        os.rename(src, os.path.join(csrc, "cpu", "swiglu_renamed.cc"))
    else:
        shutil.copy(src, os.path.join(csrc, "cpu", "swiglu_extra.cc"))
    assert not mod.is_up_to_date()
