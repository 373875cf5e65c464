"""csrc/check_cuda.py's use of the object cache (`object_cache.ObjectCache`): a hit hands back
the object an identical compile made, any change of the command or the source misses, and a
failed compile is never stored. Uses the host C++ compiler on a tiny file (no CUDA tools needed)."""
import os
import shutil

import pytest

import cuda_ctypes

check = cuda_ctypes.check_cuda_module()
CXX = shutil.which(check.host_cxx())
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler")


def new_cache(root, out_dir):
    """The cache as check_cuda's main() makes it: the temporary output folder as a placeholder."""
    return check.ObjectCache(str(root), check.cached_inputs(), {str(out_dir): "<out>"}, [CXX])


def compile_cmd(src, obj, *flags):
    return [CXX, "-c", *flags, "-o", obj, src]


def test_hits_reuse_the_object_and_any_change_misses(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "f.cc"
    src.write_text("int f() { return 1; }\n")
    obj = str(out / "f.o")
    cache = new_cache(tmp_path / "cache", out)
    assert cache.run(compile_cmd(str(src), obj)) == (0, "") and cache.hits == 0
    first = open(obj, "rb").read()
    os.remove(obj)
    assert cache.run(compile_cmd(str(src), obj))[0] == 0 and cache.hits == 1
    assert open(obj, "rb").read() == first  # the stored object, copied back
    # another output folder of the same compile (a new temporary dir per run): still a hit
    (tmp_path / "out2").mkdir()
    other = new_cache(tmp_path / "cache", tmp_path / "out2")
    assert other.key(compile_cmd(str(src), str(tmp_path / "out2" / "f.o"))) == cache.key(compile_cmd(str(src), obj))
    keys = {cache.key(compile_cmd(str(src), obj)), cache.key(compile_cmd(str(src), obj, "-O2"))}
    src.write_text("int f() { return 2; }\n")
    keys.add(cache.key(compile_cmd(str(src), obj)))
    assert len(keys) == 3  # a flag or a source byte changes the key


def test_a_failed_compile_is_not_stored(tmp_path):
    src = tmp_path / "bad.cc"
    src.write_text("int f() { return }\n")
    cache = new_cache(tmp_path / "cache", tmp_path)
    rc, out = cache.run(compile_cmd(str(src), str(tmp_path / "bad.o")))
    assert rc != 0 and "error" in out
    assert not os.path.exists(tmp_path / "cache") or not os.listdir(tmp_path / "cache")
    rc, _ = cache.run(compile_cmd(str(src), str(tmp_path / "bad.o")))
    assert rc != 0 and cache.hits == 0
