"""The stored CUDA-kernel test cases (tests/fixtures/cuda_kernel_cases.npz) are what
tests/cuda_kernel_cases.py generates, and their reference outputs are what the C++ CPU kernels
compute today, so the GPU tests (tests/test_cuda_kernels.py) compare against current kernels."""
import numpy as np
import pytest

import cuda_kernel_cases as cases_mod

STORED = cases_mod.load()
BY_NAME = {c["name"]: c for c in STORED}


def test_fixture_holds_every_generated_case():
    fresh = cases_mod.make_cases()
    assert [c["name"] for c in fresh] == [c["name"] for c in STORED]
    ops = {c["op"] for c in STORED}
    assert ops == {"rms_norm", "swiglu", "pack_transposed", "attention", "sample", "update"}
    for c in fresh:
        s = BY_NAME[c["name"]]
        assert s["op"] == c["op"] and s["attrs"] == c["attrs"], c["name"]
        assert sorted(s["inputs"]) == sorted(c["inputs"]), c["name"]
        for k, v in c["inputs"].items():
            assert s["inputs"][k].dtype == v.dtype, (c["name"], k)
            if np.issubdtype(v.dtype, np.floating):  # cos/sin tables differ in the last bits between CPUs' libm
                np.testing.assert_allclose(s["inputs"][k], v, rtol=1e-5, atol=1e-4, err_msg=f"{c['name']}/{k}")
            else:
                np.testing.assert_array_equal(s["inputs"][k], v, err_msg=f"{c['name']}/{k}")


@pytest.mark.parametrize("name", [c["name"] for c in STORED])
def test_stored_outputs_are_the_cpu_kernels_outputs(name):
    case = BY_NAME[name]
    got = cases_mod.cpu_outputs(case)
    assert sorted(got) == sorted(case["outputs"])
    for k, want in case["outputs"].items():
        assert got[k].dtype == want.dtype and got[k].shape == want.shape, (name, k)
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(got[k], want, atol=1e-5, rtol=1e-5, err_msg=f"{name}/{k}")
        else:
            np.testing.assert_array_equal(got[k], want, err_msg=f"{name}/{k}")


def test_cases_cover_padding_finished_rows_and_both_layouts():
    att = [c for c in STORED if c["op"] == "attention"]
    assert any(c["attrs"]["cols"] for c in att) and any(not c["attrs"]["cols"] for c in att)
    assert any((c["inputs"]["key_mask"] == 0).all(axis=1).any() for c in att)  # a fully padded row
    assert any(c["inputs"]["finished"].any() for c in att)
    assert any(c["attrs"]["t0"] + 1 > 128 for c in att)  # more keys than one chunk of the CUDA kernel
    # more keys than two float32 tiles of the split-K kernel (split and merged), 16-byte and scalar loads
    long = [c for c in att if c["attrs"]["t0"] + 1 > 1024]
    assert {c["inputs"]["k_cache"].shape[-1] % 4 == 0 for c in long} == {True, False}
    smp = [c for c in STORED if c["op"] == "sample"]
    assert all(c["inputs"]["finished"].any() for c in smp)
    for c in smp:  # finished rows: pad token, log-prob 0
        f = c["inputs"]["finished"].astype(bool)
        assert (c["outputs"]["tokens"][f] == c["attrs"]["pad_id"]).all()
        assert (c["outputs"]["logprobs"][f] == 0).all()
