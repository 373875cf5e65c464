"""bench/cuda_kernel_bench.py without a GPU: the attention call keeps its workspace tensor alive.

The bench needs PyTorch and a GPU; this test replaces `torch` with a stand-in that hands out
weak-referenceable tensors, so it checks the one thing a CPU can: the callable the bench times
(and captures in a CUDA graph) owns the workspace it passes to the launcher by address.
"""
import ctypes
import gc
import importlib.util
import os
import sys
import types
import weakref

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeTensor:
    """What the bench reads of a tensor: its address and shape."""

    def __init__(self, *shape):
        self.shape = shape

    def data_ptr(self):
        return id(self)


class FakeLib:
    """The attention launcher's ctypes surface: the workspace size query and the launch."""

    def __init__(self):
        self.launched_with = None

    def ppo_cuda_attention_workspace_bytes(self, *args):
        ctypes.cast(args[-1], ctypes.POINTER(ctypes.c_int64)).contents.value = 4096
        return 0

    def ppo_cuda_attention_ws(self, *args):
        self.launched_with = args
        return 0


def load_bench(monkeypatch):
    created = []

    def empty(*shape, **_):
        created.append(FakeTensor(*shape))
        return created[-1]

    stream = types.SimpleNamespace(cuda_stream=7)
    torch = types.ModuleType("torch")
    torch.empty, torch.uint8 = empty, "uint8"
    torch.cuda = types.SimpleNamespace(current_stream=lambda: stream)
    functional = types.ModuleType("torch.nn.functional")
    torch.nn = types.SimpleNamespace(functional=functional)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.nn", torch.nn)
    monkeypatch.setitem(sys.modules, "torch.nn.functional", functional)
    spec = importlib.util.spec_from_file_location("cuda_kernel_bench", os.path.join(REPO, "bench", "cuda_kernel_bench.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench, created


def test_the_attention_call_owns_its_workspace_until_it_is_dropped(monkeypatch):
    bench, created = load_bench(monkeypatch)
    lib = FakeLib()
    qkv, kc, vc, cos, sin, pos, mask, fin, out = (FakeTensor(*s) for s in [(2, 48), (1, 2, 1, 16, 64), (1, 2, 1, 64, 16),
                                                                         (65, 16), (65, 16), (2, 1), (2, 16), (2,),
                                                                         (2, 32)])
    call = bench.attention_call(lib, qkv, kc, vc, cos, sin, pos, mask, fin, out, 2, 1, 2, 1, 16, 63, 0.25)
    (ws,) = created
    assert ws.shape == (4096,)
    ws_ref = weakref.ref(ws)
    del ws, created[:]
    gc.collect()
    assert ws_ref() is not None, "the workspace was freed while the call that writes it lives"
    assert call() == 0
    assert lib.launched_with[-3:] == (id(ws_ref()), 4096, 7)  # its address, its size, the current stream
    assert lib.launched_with[11:16] == (2, 1, 2, 1, 16) and lib.launched_with[16:18] == (64, 16)  # B Tq nh nkv hd, S Tp
    del call
    gc.collect()
    assert ws_ref() is None


def timing(ours_s, torch_s, **extra):
    return {"ours_s": ours_s, "torch_s": torch_s, "ours_over_torch": ours_s / torch_s, **extra}


def test_the_table_has_a_line_per_variant_shape_and_mode(monkeypatch):
    """bench_variant times the shapes of its variant's kernel file (the timing functions stand in
    here), and the table gets one line per variant, shape and sampling mode."""
    bench, _ = load_bench(monkeypatch)
    sample = {"shape": {"B": 64, "V": 128256}, "greedy": timing(41e-6, 36e-6, logprob_err=1e-3, equals_argmax=True),
              "top_k50": timing(120e-6, 240e-6, logprob_err=2e-3)}
    variant_sample = dict(sample, greedy=timing(30e-6, 36e-6, logprob_err=1e-3, equals_argmax=False))
    decode = dict(timing(120e-6, 80e-6, max_abs_err_vs_fp32=4e-3), shape={"B": 32, "n_ctx": 2048})
    calls = []
    monkeypatch.setattr(bench, "SAMPLE_SHAPES", [(64, 128256)])
    monkeypatch.setattr(bench, "DECODE_SHAPES", [(32, 32, 8, 128, 2048)])
    monkeypatch.setattr(bench, "PREFILL_SHAPES", [])
    monkeypatch.setattr(bench, "bench_sample",
                        lambda lib, B, V, bw, iters: calls.append((lib, "sample", B, V)) or variant_sample)
    monkeypatch.setattr(bench, "bench_decode", lambda lib, *shape: calls.append((lib, "decode", *shape[:5])) or decode)
    variants = {"sample_chunk8k": bench.bench_variant("sample_chunk8k", "lib8k", 4.8e12, 5),
                "stages3": bench.bench_variant("stages3", "lib_st3", 4.8e12, 5)}
    assert calls == [("lib8k", "sample", 64, 128256), ("lib_st3", "decode", 32, 32, 8, 128, 2048)]
    assert variants["sample_chunk8k"]["flags"] == ["-DPPO_SAMPLE_CHUNK_TARGET=8192"]
    assert variants["stages3"]["kernel"] == "attention" and variants["stages3"]["prefill"] == []
    res = {"device": "H200", "torch": "2.11", "dtype": "bfloat16", "sample": [sample], "variants": variants}
    lines = bench.table_lines(res)
    assert lines[0] == "H200, torch 2.11, bfloat16"
    assert [line.split()[0] for line in lines[1:]] == ["sample_greedy", "sample_top_k50", "sample_chunk8k:sample_greedy",
                                                       "sample_chunk8k:sample_top_k50", "stages3:decode"]
    assert "x1.14" in lines[1] and lines[1].endswith("= argmax err 0.001")
    assert "x0.83" in lines[3] and "!= ARGMAX" in lines[3]
    assert "B32,n_ctx2048" in lines[5] and "x1.50" in lines[5]
