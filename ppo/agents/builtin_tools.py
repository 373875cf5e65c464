"""The shipped tools: ``calculator``, ``python`` and ``search`` (registered on import).

- ``calculator(expression)``: arithmetic on numbers with ``+ - * / // % **``, unary signs and
  parentheses, read with :mod:`ast` (never ``eval``): a name, call, attribute, comparison or
  any other node is refused, and so are expressions past 200 characters, exponents above
  ``MAX_EXPONENT`` and integers past ``MAX_DIGITS`` digits (no ``9**9**9`` that runs for hours).
- ``python(code)``: the code run by ppo/sandbox/ in a child process (wall-clock and CPU-time
  limits, a memory rlimit, a process cap, its own temporary directory, a clean environment, no
  writes outside that directory, no network and no unix socket of the host, not root, every
  process it started killed when it returns, where the kernel allows each: see the module's
  table); the answer is its standard output, with the end of its standard error when it failed.
  Options: ``wall_s``, ``cpu_s``, ``memory_mb``, ``output_bytes``, ``max_processes``.
- ``search(query)``: BM25 over a local JSONL corpus (option ``corpus``: a file with one JSON
  object per line, its text in ``text_field``), ranked by the ``bm25s`` library; the answer
  lists the ``top_k`` best passages. The index of a file is built once per process (and again
  when the file changes).
"""
import ast
import json
import operator
import os
import threading

from ..sandbox import SandboxLimits, run_python
from .tools import ToolTimeout, register_tool

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 512
MAX_DIGITS = 300

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class NotArithmetic(ValueError):
    """The calculator was given something other than arithmetic on numbers."""


def _checked(value):
    if isinstance(value, int) and value.bit_length() > MAX_DIGITS * 3.33:  # log2(10) bits per digit
        raise NotArithmetic(f"the result has more than {MAX_DIGITS} digits")
    return value


def _evaluate(node):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise NotArithmetic(f"exponents above {MAX_EXPONENT} are refused")
        return _checked(_BINARY[type(node.op)](left, right))
    raise NotArithmetic(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def calculate(expression: str):
    """The value of the arithmetic `expression`; raises NotArithmetic (or ZeroDivisionError)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise NotArithmetic(f"expressions are limited to {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise NotArithmetic(f"not an arithmetic expression: {err.msg}") from None
    return _evaluate(tree)


@register_tool("calculator", schema={"type": "object", "properties": {"expression": {
    "type": "string", "description": "arithmetic, e.g. 12*(3+4)"}}, "required": ["expression"]},
    description="Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).", timeout_s=2.0)
def calculator(expression):
    value = calculate(expression)
    return repr(value) if isinstance(value, float) else str(value)


@register_tool("python", schema={"type": "object", "properties": {"code": {
    "type": "string", "description": "a Python program; what it prints is the answer"}}, "required": ["code"]},
    description="Run a Python program in a sandbox and return what it printed.", timeout_s=30.0,
    options={"wall_s": 5.0, "cpu_s": 3, "memory_mb": 512, "output_bytes": 16384, "max_processes": 32})
def python(code, *, wall_s, cpu_s, memory_mb, output_bytes, max_processes):
    limits = SandboxLimits(wall_s=float(wall_s), cpu_s=int(cpu_s), memory_mb=int(memory_mb),
                           output_bytes=int(output_bytes), max_processes=int(max_processes))
    result = run_python(code, limits=limits)
    if result.timed_out:
        raise ToolTimeout(f"the program ran past {wall_s:g} s and was killed")
    if result.ok:
        return result.stdout
    status = "CPU time limit" if result.cpu_limit_hit else f"exit status {result.returncode}"
    return f"{result.stdout}{result.stderr[-1000:]}({status})"


_INDEXES = {}
_INDEX_LOCK = threading.Lock()


def _corpus_index(path, text_field):
    """(passages, bm25s retriever) of the JSONL file at `path`, cached per (path, mtime, field)."""
    import bm25s

    key = (os.path.abspath(path), os.path.getmtime(path), text_field)
    with _INDEX_LOCK:
        if key not in _INDEXES:
            with open(path, encoding="utf-8") as f:
                passages = [str(json.loads(line)[text_field]) for line in f if line.strip()]
            if not passages:
                raise ValueError(f"search corpus {path} has no passages")
            retriever = bm25s.BM25()
            retriever.index(bm25s.tokenize(passages, stopwords="en", show_progress=False), show_progress=False)
            _INDEXES[key] = (passages, retriever)
        return _INDEXES[key]


def bm25_search(query, corpus, top_k=3, text_field="text"):
    """The best `top_k` passages of `corpus` for `query` with a positive BM25 score, best first,
    as `[(score, passage), ...]`."""
    import bm25s

    passages, retriever = _corpus_index(corpus, text_field)
    tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
    if not tokens.ids[0]:  # only stopwords or punctuation: nothing to match
        return []
    docs, scores = retriever.retrieve(tokens, k=min(int(top_k), len(passages)), show_progress=False)
    return [(float(s), passages[int(d)]) for d, s in zip(docs[0], scores[0]) if s > 0]


@register_tool("search", schema={"type": "object", "properties": {"query": {
    "type": "string", "description": "words to look for"}}, "required": ["query"]},
    description="Search the local document collection and return the best passages.", timeout_s=10.0,
    options={"corpus": None, "top_k": 3, "text_field": "text"})
def search(query, *, corpus, top_k, text_field):
    hits = bm25_search(query, corpus, top_k, text_field)
    if not hits:
        return "No results."
    return "\n".join(f"[{i + 1}] {passage}" for i, (_, passage) in enumerate(hits))
