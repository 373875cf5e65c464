"""The sandbox for model-written code (ppo/sandbox/) and the `code` verifier that runs in it:
limits that end the child, its clean environment, and what the verifier makes of the results."""
import json
import os
import time

import pytest

from ppo.sandbox import SandboxLimits, run_python
from ppo.scorers import WeightedScorer, get_scorer

FAST = SandboxLimits(wall_s=5, cpu_s=2, memory_mb=512)


def test_output_environment_and_working_directory(monkeypatch):
    monkeypatch.setenv("PPO_REWARD_SERVER_TOKEN", "secret-token")
    code = "import os, json\nopen('out.txt', 'w').write('x')\nprint(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), 'files': sorted(os.listdir('.'))}))"
    result = run_python(code, limits=FAST, files={"data.txt": "hello"})
    assert result.ok and not result.timed_out, result
    seen = json.loads(result.stdout)
    assert "secret-token" not in json.dumps(seen["env"]) and "PPO_REWARD_SERVER_TOKEN" not in seen["env"]
    assert seen["env"]["HOME"] == seen["cwd"] and "ppo-sandbox-" in seen["cwd"]
    assert {"data.txt", "main.py", "out.txt"} <= set(seen["files"])
    assert not os.path.exists(seen["cwd"])  # the temporary directory is gone afterwards


def test_wall_clock_limit_kills_the_whole_process_group(tmp_path):
    """The child forks a grandchild that sleeps; both are gone after the limit. The grandchild
    prints its pid as the host sees it (/proc is the host's, also in a pid namespace)."""
    code = ("import os, time\npid = os.fork()\nif pid == 0:\n    print(os.readlink('/proc/self'), flush=True)\n"
            "    time.sleep(60)\nelse:\n    time.sleep(60)")
    start = time.monotonic()
    result = run_python(code, limits=SandboxLimits(wall_s=1.5, cpu_s=5))
    assert result.timed_out and result.returncode is None and time.monotonic() - start < 10
    grandchild = int(result.stdout.split()[0])
    time.sleep(0.2)
    assert not alive(grandchild)


def alive(pid):
    """Whether `pid` runs: not gone and not a zombie (an init that does not reap, as in some containers)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_cpu_memory_and_output_limits():
    spin = run_python("while True:\n    pass", limits=SandboxLimits(wall_s=30, cpu_s=1))
    assert spin.cpu_limit_hit and not spin.timed_out and not spin.ok
    big = run_python("x = bytearray(2 * 1024 ** 3)", limits=FAST)
    assert big.returncode != 0 and "MemoryError" in big.stderr
    loud = run_python("print('y' * 100000)", limits=SandboxLimits(output_bytes=1000))
    assert loud.stdout_truncated and len(loud.stdout) == 1000


def test_network_is_cut_off_where_the_kernel_allows_it():
    code = ("import socket\ntry:\n    socket.create_connection(('10.255.255.1', 80), timeout=2)\n    print('connected')\n"
            "except OSError as err:\n    print('no network', err.errno)")
    result = run_python(code, limits=FAST)
    if not result.network_isolated:
        pytest.skip("no user/network namespaces on this machine: the sandbox says so (network_isolated False)")
    assert result.stdout.startswith("no network")


def test_file_names_stay_in_the_working_directory():
    with pytest.raises(ValueError, match="plain name"):
        run_python("pass", files={"../x.py": ""})


ADD = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = json.dumps({"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]})
IO = json.dumps({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12"]})


@pytest.mark.parametrize("response, label, expected", [
    (ADD, TESTS, 1.0),
    ("Here it is:\n" + ADD.replace("a + b", "a - b"), TESTS, 0.0),  # wrong program
    ("def add(a, b):\n    return a + b", TESTS, 0.0),  # no code block: unreadable
    ("```python\nimport sys\nsys.exit(0)\n```", TESTS, 0.0),  # exits before the tests
    ("```python\nwhile True:\n    pass\n```", TESTS, 0.0),  # runs out of time
    ("```py\na, b = map(int, input().split())\nprint(a + b)\n```", IO, 1.0),
    ("```python\nprint(3)\n```", IO, 0.0),
    (ADD, "assert add(2, 2) == 4", 1.0),  # plain test code
    ("```python\ndef f(x):\n    return 2 * x\n```", json.dumps({"test": "def check(c):\n    assert c(3) == 6",
                                                           "entry_point": "f"}), 1.0),
])
def test_code_verifier_table(response, label, expected):
    scorer = WeightedScorer({"code": {"timeout_s": 2}}).functions[0]
    assert scorer("", label, response) == expected


def test_code_verifier_partial_credit_and_bad_labels():
    partial = WeightedScorer({"code": {"partial": True, "timeout_s": 2}}).functions[0]
    half_right = "```python\ndef add(a, b):\n    return a + b if isinstance(a, int) else None\n```"
    assert partial("", TESTS, half_right) == pytest.approx(2 / 3)
    for bad in ("", "{not json", json.dumps({"tests": []}), json.dumps({"inputs": ["1"], "outputs": []})):
        with pytest.raises(ValueError, match="code label"):
            get_scorer("code")("", bad, ADD)
