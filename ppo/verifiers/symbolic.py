"""Symbolic equivalence of two LaTeX answers through sympy, in a child process with limits.

:func:`to_sympy_syntax` rewrites a normal form (``ppo.verifiers.latex.normalize``) into
sympy's syntax from a whitelist: numbers, single-letter symbols, ``+ - * / ^ ( )``, ``\\frac``,
``\\sqrt`` (with an index too), ``\\cdot``/``\\times``/``\\div``, ``\\pi``, ``\\infty`` and a few
functions (``\\sin``, ``\\cos``, ``\\tan``, ``\\log``, ``\\ln``, ``\\exp``). Anything else
(sets, intervals, matrices, equations, text) gives None and is compared as a string only. So the
text sympy parses holds no Python but names from that list.

:func:`equivalent` runs sympy (parse, ``simplify(a - b) == 0``, or for two constants
``|a - b| <= 1e-9 (1 + |b|)`` numerically) in a child process forked by a worker process
(``python -I``, started on first use, sympy imported once, no environment of the caller), under
``RLIMIT_CPU`` and ``RLIMIT_AS``, killed at the wall-clock limit: sympy can take unbounded time
and memory (``9^{9^{9}}`` is evaluated exactly). A check that runs out of time or memory raises
:class:`SymbolicTimeout`. Checks are serialised through the one worker; verdicts are cached per
pair of strings. POSIX only (``os.fork``, ``resource``).
"""
import functools
import json
import os
import re
import subprocess
import sys
import threading
from typing import Optional

SYMPY_CPU_S = 5
SYMPY_WALL_S = 10.0
SYMPY_MEMORY_MB = 2048
FUNCTIONS = {"\\sin": "sin", "\\cos": "cos", "\\tan": "tan", "\\log": "log", "\\ln": "log", "\\exp": "exp"}
_SIMPLE = {"\\cdot": "*", "\\times": "*", "\\div": "/", "\\pi": "pi", "\\infty": "oo"}
_ALLOWED_RE = re.compile(r"[0-9a-zA-Z.+\-*/()^ ]*")
_NAME_RE = re.compile(r"[a-zA-Z]+")
_ATTRIBUTE_RE = re.compile(r"[a-zA-Z)]\s*\.|\.\s*[a-zA-Z(]")  # a dot that is no decimal point
_NAMES = {"sqrt", "pi", "oo", "sin", "cos", "tan", "log", "exp"}


def _group(s, i):
    """(content, end) of the braced group at s[i] == "{", else the single character at s[i]."""
    if i >= len(s):
        raise ValueError("missing argument")
    if s[i] != "{":
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
    raise ValueError("unclosed brace")


def _convert(s):
    """Recursive rewrite of the LaTeX in `s`; ValueError on anything outside the whitelist."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i):
            num, i = _group(s, i + 5)
            den, i = _group(s, i)
            out.append(f"(({_convert(num)})/({_convert(den)}))")
        elif s.startswith("\\sqrt", i):
            i += 5
            index = None
            if s.startswith("[", i):
                end = s.index("]", i)
                index, i = s[i + 1 : end], end + 1
            arg, i = _group(s, i)
            out.append(f"sqrt({_convert(arg)})" if index is None else f"(({_convert(arg)})**(1/({_convert(index)})))")
        elif s[i] == "^":
            arg, i = _group(s, i + 1)
            out.append(f"**({_convert(arg)})")
        elif s[i] == "\\":
            name = re.match(r"\\[a-zA-Z]+", s[i:])
            word = name.group(0) if name else s[i : i + 2]
            if word in _SIMPLE:
                out.append(f" {_SIMPLE[word]} ")
            elif word in FUNCTIONS:
                out.append(f" {FUNCTIONS[word]}")
            else:
                raise ValueError(f"unsupported {word}")
            i += len(word)
        elif s[i] in "{}":
            out.append("(" if s[i] == "{" else ")")
            i += 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def to_sympy_syntax(normalized: str) -> Optional[str]:
    """Sympy syntax for a normal form, or None when it holds anything outside the whitelist.
    Runs of letters that are no whitelisted name are products of single-letter symbols."""
    if not normalized or len(normalized) > 500:
        return None
    try:
        text = _convert(normalized)
    except ValueError:
        return None
    if not _ALLOWED_RE.fullmatch(text) or _ATTRIBUTE_RE.search(text):
        return None
    text = _NAME_RE.sub(lambda m: m.group(0) if m.group(0) in _NAMES else "*".join(m.group(0)), text)
    return text.replace("^", "**")


# The worker: a long-lived `python -I` process that imports sympy once and forks one child per
# check (itself single-threaded, so forking is safe); the child sets its limits, answers on a
# pipe, and is killed at the wall-clock limit. Requests and answers are JSON lines.
_WORKER = r"""
import json, os, resource, select, signal, string, sys
import sympy
from sympy.parsing.sympy_parser import convert_xor, implicit_multiplication_application, parse_expr, standard_transformations
NAMES = {c: sympy.Symbol(c) for c in string.ascii_letters}
NAMES.update(sqrt=sympy.sqrt, pi=sympy.pi, oo=sympy.oo, sin=sympy.sin, cos=sympy.cos, tan=sympy.tan,
             log=sympy.log, exp=sympy.exp)
RULES = standard_transformations + (implicit_multiplication_application, convert_xor)

def verdict(a, b):
    try:
        x, y = (parse_expr(t, local_dict=dict(NAMES), transformations=RULES)
                for t in (a, b))
        if sympy.simplify(x - y) == 0:
            return True
        if not x.free_symbols and not y.free_symbols:
            gap, scale = complex(sympy.N(x - y, 30)), complex(sympy.N(y, 30))
            return abs(gap) <= 1e-9 * (1 + abs(scale))
        return False
    except (MemoryError, RecursionError):
        return "limit"
    except Exception:
        return None

def check(req):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        resource.setrlimit(resource.RLIMIT_CPU, (req["cpu_s"], req["cpu_s"] + 1))
        resource.setrlimit(resource.RLIMIT_AS, (req["memory_mb"] << 20, req["memory_mb"] << 20))
        os.write(w, json.dumps({"verdict": verdict(req["a"], req["b"])}).encode())
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], req["wall_s"])
    data = b""
    if ready:
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    os.close(r)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    if not ready:
        return {"verdict": "limit", "why": "no verdict within %s s" % req["wall_s"]}
    return json.loads(data) if data else {"verdict": "limit", "why": "ended without a verdict (CPU or memory limit)"}

for line in sys.stdin:
    sys.stdout.write(json.dumps(check(json.loads(line))) + "\n")
    sys.stdout.flush()
"""


class SymbolicTimeout(Exception):
    """The sympy check ran out of time or memory."""


class _Worker:
    """The sympy worker process (started on first use, restarted when it dies); one check at a time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc = None

    def _start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env={"PATH": os.defpath, "LANG": "C.UTF-8"}, text=True, close_fds=True,
        )

    def ask(self, request):
        with self.lock:
            for attempt in range(2):
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
                try:
                    self.proc.stdin.write(json.dumps(request) + "\n")
                    self.proc.stdin.flush()
                    line = self.proc.stdout.readline()
                except (BrokenPipeError, OSError):
                    line = ""
                if line:
                    return json.loads(line)
                self.proc = None
            raise RuntimeError("the sympy worker process failed twice (is sympy installed? pip install sympy)")


_worker = _Worker()


@functools.lru_cache(maxsize=4096)
def _verdict(a, b, cpu_s, wall_s, memory_mb):
    answer = _worker.ask({"a": a, "b": b, "cpu_s": cpu_s, "wall_s": wall_s, "memory_mb": memory_mb})
    if answer["verdict"] == "limit":
        raise SymbolicTimeout(answer.get("why", "the check ran out of memory or recursion depth"))
    return answer["verdict"]


def equivalent(a: str, b: str, cpu_s=SYMPY_CPU_S, wall_s=SYMPY_WALL_S, memory_mb=SYMPY_MEMORY_MB) -> Optional[bool]:
    """True/False: sympy's verdict on two sympy-syntax strings (from :func:`to_sympy_syntax`);
    None when sympy cannot parse one. Raises :class:`SymbolicTimeout` when the check runs out of
    time or memory (the verdict is not cached then)."""
    return _verdict(a, b, int(cpu_s), float(wall_s), int(memory_mb))
