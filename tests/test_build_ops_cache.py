"""csrc/object_cache.py's `ObjectCache` as csrc/build_ops.py uses it: an identical compile in
another checkout folder or venv hits and hands back the same object, an edit of a source or of a
header among the inputs misses, a failed compile is never stored; and build_ops' compiler hook
sends compiles through the cache and the link past it. Host C++ compiler on tiny files; no
Paddle build (the end-to-end build is `python csrc/build_ops.py`, see docs/testing.md)."""
import importlib.util
import os
import shutil
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = shutil.which(os.environ.get("CXX") or "c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_test_{name}", os.path.join(REPO, "csrc", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


oc = _load("object_cache")


def checkout(root, value=1, scale=3):
    """A stand-in csrc/: common.h (a constant), cpu/f.cc (uses it), build/ for objects."""
    os.makedirs(os.path.join(root, "cpu"))
    os.makedirs(os.path.join(root, "build"))
    with open(os.path.join(root, "common.h"), "w") as f:
        f.write(f"constexpr int kScale = {scale};\n")
    with open(os.path.join(root, "cpu", "f.cc"), "w") as f:
        f.write(f'#include "../common.h"\nint f() {{ return {value} * kScale; }}\n')
    return root


def cache_for(root, cache_root):
    inputs = [os.path.join(root, "common.h"), os.path.join(root, "cpu", "f.cc")]
    return oc.ObjectCache(cache_root, inputs, base=root, facts={"paddle": "test"})


def compile_cmd(root, *flags):
    """The shape of the command Paddle's build runs: compiler, flags, -c, source, -o, object."""
    return [CXX, "-O2", *flags, f"-I{root}", "-c", os.path.join(root, "cpu", "f.cc"),
            "-o", os.path.join(root, "build", "f.o")]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_a_fresh_clone_elsewhere_hits_and_gets_the_same_object(tmp_path):
    store = str(tmp_path / "store")
    a = checkout(str(tmp_path / "clone-a"))
    first = cache_for(a, store)
    assert first.run(compile_cmd(a)) == (0, "")
    assert (first.hits, first.misses) == (0, 1) and len(os.listdir(store)) == 1
    b = checkout(str(tmp_path / "elsewhere" / "clone-b"))
    second = cache_for(b, store)
    assert second.key(compile_cmd(b)) == first.key(compile_cmd(a))  # paths differ, key does not
    assert second.run(compile_cmd(b)) == (0, "")
    assert (second.hits, second.misses) == (1, 0)
    assert read(os.path.join(b, "build", "f.o")) == read(os.path.join(a, "build", "f.o"))
    assert len(os.listdir(store)) == 1


def test_a_new_venv_keeps_the_key(tmp_path, monkeypatch):
    root = checkout(str(tmp_path / "c"))
    keys = []
    for venv in ("venv-one", "venv-two"):
        monkeypatch.setattr(sys, "prefix", str(tmp_path / venv))
        keys.append(cache_for(root, str(tmp_path / "store")).key(compile_cmd(root, f"-I{tmp_path / venv}/include")))
    assert keys[0] == keys[1]
    other = cache_for(root, str(tmp_path / "store")).key(compile_cmd(root, "-I/opt/elsewhere/include"))
    assert other != keys[0]  # a folder outside the checkout and the venv stays in the key


@pytest.mark.parametrize("edit", ["header", "source", "flag", "facts"])
def test_an_edit_misses_and_compiles_again(tmp_path, edit):
    store = str(tmp_path / "store")
    root = checkout(str(tmp_path / "c"))
    before = cache_for(root, store)
    assert before.run(compile_cmd(root))[0] == 0
    old_obj = read(os.path.join(root, "build", "f.o"))
    flags = ()
    if edit == "header":
        checkout(str(tmp_path / "c2"), scale=5)
        shutil.copy(str(tmp_path / "c2" / "common.h"), os.path.join(root, "common.h"))
    elif edit == "source":
        checkout(str(tmp_path / "c2"), value=7)
        shutil.copy(str(tmp_path / "c2" / "cpu" / "f.cc"), os.path.join(root, "cpu", "f.cc"))
    elif edit == "flag":
        flags = ("-O0",)
    after = cache_for(root, store)
    if edit == "facts":  # another Paddle version
        after = oc.ObjectCache(store, [os.path.join(root, "common.h"), os.path.join(root, "cpu", "f.cc")],
                               base=root, facts={"paddle": "other"})
    assert after.key(compile_cmd(root, *flags)) != before.key(compile_cmd(root))
    assert after.run(compile_cmd(root, *flags))[0] == 0
    assert (after.hits, after.misses) == (0, 1) and len(os.listdir(store)) == 2
    if edit in ("header", "source"):  # the new object is the edited code's, not the stored one
        assert read(os.path.join(root, "build", "f.o")) != old_obj


def test_a_failed_compile_is_not_stored(tmp_path):
    store = str(tmp_path / "store")
    root = checkout(str(tmp_path / "c"))
    with open(os.path.join(root, "cpu", "f.cc"), "a") as f:
        f.write("int g() { return }\n")
    cache = cache_for(root, store)
    for _ in range(2):  # the second try compiles (and fails) again
        rc, out = cache.run(compile_cmd(root))
        assert rc != 0 and "error" in out
    assert (cache.hits, cache.misses) == (0, 2)
    assert not os.path.exists(store) or os.listdir(store) == []


def test_prune_deletes_only_long_unused_objects(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "old.o").write_bytes(b"x")
    (store / "new.o").write_bytes(b"y")
    os.utime(store / "old.o", (1, 1))
    assert oc.prune(str(store), max_age_days=30) == 1
    assert sorted(os.listdir(store)) == ["new.o"]
    assert oc.prune(str(tmp_path / "absent")) == 0


def test_build_ops_hook_caches_compiles_and_passes_the_link_through(tmp_path):
    bo = _load("build_ops")
    root = checkout(str(tmp_path / "c"))
    cache = cache_for(root, str(tmp_path / "store"))
    linked = []
    spawn = lambda cmd, **kw: linked.append(cmd)  # noqa: E731 (stands in for distutils' spawn)
    for _ in range(2):
        assert bo._cached_spawn(spawn, cache, compile_cmd(root)) is None
    assert (cache.hits, cache.misses, linked) == (1, 1, [])
    link = [CXX, "-shared", os.path.join(root, "build", "f.o"), "-o", os.path.join(root, "build", "f.so")]
    bo._cached_spawn(spawn, cache, link)
    assert linked == [link] and (cache.hits, cache.misses) == (1, 1)
    with open(os.path.join(root, "cpu", "f.cc"), "a") as f:
        f.write("int g() { return }\n")
    with pytest.raises(Exception, match="compiling .*f.cc failed"):
        bo._cached_spawn(spawn, cache, compile_cmd(root))


def test_build_ops_keys_on_every_cpu_file_and_header():
    bo = _load("build_ops")
    names = {os.path.relpath(p, bo.CSRC) for p in bo.cache_inputs(with_cuda=False)}
    assert "common.h" in names and "cpu/attention.cc" in names
    assert not any(n.startswith("cuda/") for n in names)
    assert any(n.startswith("cuda/") for n in {os.path.relpath(p, bo.CSRC) for p in bo.cache_inputs(True)})
