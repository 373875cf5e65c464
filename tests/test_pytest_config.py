"""pytest.ini runs with `--strict-markers`: a misspelt marker is a collection error, not a test
that silently lost its marker (a test marked `slwo` would run in the default suite, and a
slow test without its marker keeps the default suite from its time budget). Every marker the
tests use is registered there."""
import configparser
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTEST_INI = os.path.join(ROOT, "pytest.ini")
BUILTIN_MARKERS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}


def ini():
    config = configparser.ConfigParser()
    config.read(PYTEST_INI)
    return config["pytest"]


def registered_markers():
    return {line.split(":", 1)[0].strip() for line in ini()["markers"].strip().splitlines() if line.strip()}


def markers_used():
    used = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "tests")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    used |= set(re.findall(r"pytest\.mark\.([A-Za-z_]\w*)", f.read()))
    return used


def test_strict_markers_is_on_and_every_marker_used_is_registered():
    assert "--strict-markers" in ini()["addopts"].split()
    used = markers_used()
    assert "slow" in used and "parametrize" in used  # the scan finds markers
    assert used - BUILTIN_MARKERS <= registered_markers(), sorted(used - BUILTIN_MARKERS - registered_markers())


def test_a_misspelt_marker_is_a_collection_error(tmp_path):
    test_file = tmp_path / "test_typo.py"
    test_file.write_text("import pytest\n\n\n@pytest.mark.%s\ndef test_x():\n    pass\n" % "slwo")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", PYTEST_INI, "--rootdir", str(tmp_path), "-n", "0", "-q", "--collect-only",
         str(test_file)],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "'slwo' not found in `markers` configuration option" in proc.stdout + proc.stderr, proc.stdout[-2000:]
