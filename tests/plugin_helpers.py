"""Writing an outside plugin module for a test: one file in a fresh folder on `sys.path`."""
import sys
import uuid


def write_plugin_module(tmp_path, monkeypatch, prefix, source):
    """Write `source` as a new module `<prefix>_<random>` under `tmp_path/plugin`, importable for
    the test; returns its name. A new name each test, since the registries outlive a module."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    return name


def forget_module(name):
    """Drop module `name` from `sys.modules` (the test's plugin, once done)."""
    sys.modules.pop(name, None)
