"""MKL's AVX2 path is forced on AMD CPUs only, and a value the user set is kept."""
from ppo.common.cpu_flags import cpu_vendor, default_mkl_code_path


def test_amd_gets_the_avx2_path_and_intel_keeps_mkls_own():
    amd, intel = {}, {}
    assert default_mkl_code_path(amd, vendor="AuthenticAMD") == "5" and amd == {"MKL_DEBUG_CPU_TYPE": "5"}
    assert default_mkl_code_path(intel, vendor="GenuineIntel") is None and intel == {}


def test_a_value_the_user_set_is_kept():
    for vendor in ("AuthenticAMD", "GenuineIntel"):
        env = {"MKL_DEBUG_CPU_TYPE": ""}
        assert default_mkl_code_path(env, vendor=vendor) == "" and env == {"MKL_DEBUG_CPU_TYPE": ""}


def test_the_vendor_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert cpu_vendor(str(info)) == "AuthenticAMD"
