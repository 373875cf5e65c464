"""MKL's code path on a CPU, chosen before Paddle loads (no Paddle import here).

MKL picks a slow generic path on AMD CPUs; `MKL_DEBUG_CPU_TYPE=5` makes it take its AVX2 path
there (3-4x faster matmuls on the AVX2-only AMD machines this toolkit is developed on). On an
Intel CPU MKL already takes its best path, and forcing AVX2 costs an AVX-512 machine about a
quarter of a GRPO step (docs/benchmarks.md). So the entry points set it on AMD CPUs only, and
never override a value the user set (`MKL_DEBUG_CPU_TYPE=5` or empty). The test suite and the
demo scripts set it everywhere, so that their pinned numbers come from one code path on every
machine."""
import os
import platform


def cpu_vendor(cpuinfo="/proc/cpuinfo"):
    """The CPU vendor id ("AuthenticAMD", "GenuineIntel", ...), or "" when unknown."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "AuthenticAMD" if "AMD" in platform.processor().upper() else ""


def default_mkl_code_path(environ=os.environ, vendor=None):
    """Set `MKL_DEBUG_CPU_TYPE=5` in `environ` on an AMD CPU when it is unset; returns its value
    (None when unset)."""
    if (vendor if vendor is not None else cpu_vendor()) == "AuthenticAMD":
        environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
    return environ.get("MKL_DEBUG_CPU_TYPE")
