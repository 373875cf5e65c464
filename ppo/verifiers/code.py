"""``code``: run the response's program against the label's tests in the sandbox (``ppo/sandbox/``).

The program is the last fenced block of the response (```` ```python ````, ```` ```py ```` or
```` ``` ````); with ``require_block`` False a response without one is run whole. The label holds
the tests, one of:

- ``{"tests": ["assert f(1) == 2", ...]}`` (or MBPP's ``"test_list"``): each statement runs after
  the program, in its namespace, in one sandboxed process; a statement passes when it raises
  nothing;
- ``{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}`` (APPS / CodeContests style): one
  sandboxed run per case with the input on stdin; it passes when the run exits 0 within the
  limits and its output equals the expected one line by line (trailing spaces and blank lines
  at the ends ignored);
- ``{"test": "def check(candidate): ...", "entry_point": "f"}`` (HumanEval): one test,
  ``check(f)``;
- any other text: Python run after the program as one test.

Score: 1.0 when every test passes, else 0.0 (``partial``: the fraction that pass). A program
that fails, raises, exits early, prints past the output limit or runs out of time or memory
scores as failing tests (0.0): that is the answer's fault. No code block (with ``require_block``)
is an unreadable answer: 0.0. A label that is not one of the forms above, or holds no test,
and a sandbox that cannot run (``SandboxUnavailable``: no POSIX limits, the interpreter cannot
start) raise: the reward cannot be computed.

The verdict of statement tests is printed from inside the process that ran the program, tagged
with a token the harness reads from stdin; a program written to look for that token in its own
interpreter could fake passes (stdin/stdout cases are judged here, outside). See
``ppo/sandbox/`` for what the sandbox does not protect against.
"""
import json
import re
import secrets
from typing import List, Optional

from ..sandbox import SandboxLimits, run_python
from ..common.registry_settings import Setting
from ..scoring.registry import ScorerFacts, register_scorer

_BLOCK_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_HARNESS = """import json, sys
def _run(token):
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
    except BaseException as err:
        print(token, "program", type(err).__name__, flush=True)
        return
    for i, test in enumerate(json.load(open("tests.json"))):
        try:
            exec(compile(test, "test_%d.py" % i, "exec"), namespace)
            print(token, i, "pass", flush=True)
        except BaseException as err:
            print(token, i, "fail", type(err).__name__, flush=True)
_run(sys.stdin.readline().strip())
"""


def code_block(response: str, require_block=True) -> Optional[str]:
    """The last fenced code block of `response`; without one, the response (or None with `require_block`)."""
    blocks = _BLOCK_RE.findall(response)
    if blocks:
        return blocks[-1]
    return None if require_block else response


def parse_tests(tgt: str):
    """``("statements", [str])`` or ``("io", [(input, output)])`` from a label; ValueError when it holds no test."""
    text = tgt.strip()
    if not text:
        raise ValueError("code label is empty: it must hold the tests")
    if not text.startswith("{"):
        return "statements", [text]
    try:
        spec = json.loads(text)
    except ValueError as err:
        raise ValueError(f"code label starts with '{{' but is not JSON: {err}") from None
    if "inputs" in spec or "outputs" in spec:
        inputs, outputs = spec.get("inputs"), spec.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
            raise ValueError("code label: 'inputs' and 'outputs' must be non-empty lists of the same length")
        return "io", [(str(i), str(o)) for i, o in zip(inputs, outputs)]
    if "test" in spec and "entry_point" in spec:
        return "statements", [f"{spec['test']}\ncheck({spec['entry_point']})"]
    tests = spec.get("tests", spec.get("test_list"))
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError("code label: give 'tests' (a non-empty list of statements), 'inputs'/'outputs', "
                         f"or 'test' with 'entry_point'; got keys {sorted(spec)}")
    return "statements", tests


def _lines(text):
    return [line.rstrip() for line in text.strip().splitlines()]


def run_statements(program: str, tests: List[str], limits: SandboxLimits) -> List[bool]:
    """Whether each statement passed after `program`, all in one sandboxed process."""
    token = secrets.token_hex(16)
    result = run_python(_HARNESS, stdin=token + "\n", limits=limits,
                        files={"solution.py": program, "tests.json": json.dumps(tests)})
    passed = set()
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == token and parts[2] == "pass" and parts[1].isdigit():
            passed.add(int(parts[1]))
    return [i in passed for i in range(len(tests))]


def run_io(program: str, cases, limits: SandboxLimits, stop_at_failure: bool) -> List[bool]:
    """Whether each (input, output) case passed, one sandboxed run each."""
    out = []
    for given, expected in cases:
        result = run_python(program, stdin=given, limits=limits)
        out.append(result.ok and not result.stdout_truncated and _lines(result.stdout) == _lines(expected))
        if stop_at_failure and not out[-1]:
            return out + [False] * (len(cases) - len(out))
    return out


SETTINGS = (
    Setting("timeout_s", float, 10.0, "Wall-clock seconds of one sandboxed run (and as many CPU seconds, rounded up).",
            bounds=(0.0, False, None, False)),
    Setting("memory_mb", int, 1024, "Address space (MB) of one sandboxed run.", bounds=(1, True, None, False)),
    Setting("partial", bool, False, "Score the fraction of the tests passed (false: 1 only when all pass)."),
    Setting("require_block", bool, True, "The program is the last fenced code block (false: the whole response "
            "when it has none)."),
)


def make_code(timeout_s=10.0, memory_mb=1024, partial=False, require_block=True):
    """The ``code`` scorer: each sandboxed run gets `timeout_s` wall-clock seconds (and as many
    CPU seconds, rounded up) and `memory_mb` of address space."""
    limits = SandboxLimits(wall_s=float(timeout_s), cpu_s=max(1, int(-(-float(timeout_s) // 1))), memory_mb=int(memory_mb))

    def code_score(src: str, tgt: str, response: str) -> float:
        kind, tests = parse_tests(tgt)
        program = code_block(response, require_block)
        if program is None or not program.strip():
            return 0.0
        if kind == "io":
            passed = run_io(program, tests, limits, stop_at_failure=not partial)
        else:
            passed = run_statements(program, tests, limits)
        if partial:
            return sum(passed) / len(passed)
        return 1.0 if all(passed) else 0.0

    code_score.extract_answer = lambda src, response: code_block(response, require_block)
    return code_score


register_scorer("code", make_code(), ScorerFacts(
    summary="the last fenced python block passes the label's tests, run in a sandboxed child process",
    values="{0, 1} ([0, 1] with partial)",
    label="JSON: tests (assert statements), inputs/outputs (stdin/stdout), test + entry_point; or test code",
    lowest_when="no code block; a test fails; the program raises, times out or runs out of memory",
    raises_when="the label holds no test in a known form; the sandbox cannot run", correct_at=1.0,
    settings=SETTINGS, build=make_code,
))
