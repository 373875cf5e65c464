"""The sandbox for code a model wrote (`runner.run_python`): a child process with time, CPU and
memory limits, its own directory, a clean environment, namespaces and a seccomp filter
(`child.py`, `ns.py`, `seccomp.py`, run and loaded by path); docs/sandbox.md says what it does
not protect against."""
from .runner import (  # noqa: F401 (_result: the report's reading, tested on its own)
    CODE_FILE, SandboxLimits, SandboxResult, SandboxUnavailable, _result, clean_environment, run_python,
)

__all__ = ["CODE_FILE", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "clean_environment", "run_python"]
