"""The reward server run as a real subprocess on loopback: contract, rejections, load.

Every server is started on a free 127.0.0.1 port, polled on /health for a bounded
time, and terminated by its fixture. `flaky_scorer` below is the scorer of the
error tests, loaded by the server as `--scorer tests.test_reward_server:flaky_scorer`.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 10.0


def flaky_scorer(src, tgt, response):
    """1.0 normally; raises on response 'boom'; returns NaN on 'nan', a string on 'str'."""
    if response == "boom":
        raise RuntimeError("scorer exploded on purpose")
    if response == "nan":
        return float("nan")
    if response == "str":
        return "1.0"
    return 1.0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python reward_server.py ...` on a free loopback port; `stop()` terminates it."""

    def __init__(self, *args, cwd=ROOT, script="ppo/reward_server.py"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="reward_server_", suffix=".log", delete=False)
        cmd = [sys.executable, script, "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_healthy()

    def log_text(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def _wait_healthy(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"reward server exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if requests.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"reward server not healthy after {START_TIMEOUT_S}s:\n{self.log_text()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        return self.proc.returncode

    def cleanup(self):
        self.stop()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


@pytest.fixture(scope="module")
def reverse_server():
    server = ServerProcess("--scorer", "reverse", "--max_batch", "50", "--max_body_bytes", "20000", "--threads", "8")
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def flaky_server():
    server = ServerProcess("--scorer", "tests.test_reward_server:flaky_scorer")
    yield server
    server.cleanup()


def post(server, body, **kwargs):
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    return requests.post(
        server.url, data=body, headers={"Content-Type": "application/json"}, timeout=REQUEST_TIMEOUT_S, **kwargs
    )


# ---------------------------------------------------------------- contract


def test_health(reverse_server):
    resp = requests.get(reverse_server.url + "/health", timeout=REQUEST_TIMEOUT_S)
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "scorer": "reverse", "token_required": False}


def test_contract(reverse_server):
    body = {
        "src": ["Reverse: abc", "Reverse: k3x9q", "Reverse: 12345"],
        "tgt": ["cba", "q9x3k", "54321"],
        "response": ["cba", "9qx3k", " 54321\n"],
    }
    resp = requests.post(reverse_server.url, json=body, timeout=REQUEST_TIMEOUT_S)  # as PaddleNLP's client posts
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    assert resp.json() == {"error_code": 0, "error_msg": "Success", "score": [1.0, 0.0, 1.0]}
    # a trailing slash and extra keys are fine
    resp = requests.post(reverse_server.url + "/", json={**body, "extra": 1}, timeout=REQUEST_TIMEOUT_S)
    assert resp.json()["score"] == [1.0, 0.0, 1.0]


def ok_body(n=2):
    return {"src": ["s"] * n, "tgt": ["t"] * n, "response": ["t"] * n}


@pytest.mark.parametrize(
    "body, code, fragment",
    [
        (b"this is not json", 4001, "not valid JSON"),
        (b"\xff\xfe\x00garbage", 4001, "not valid JSON"),
        (b"", 4001, "not valid JSON"),
        ([["s"], ["t"], ["r"]], 4001, "must be a JSON object"),
        ({"src": ["s"], "response": ["r"]}, 4002, "missing field(s) ['tgt']"),
        ({}, 4002, "missing field(s) ['src', 'tgt', 'response']"),
        ({"src": "s", "tgt": ["t"], "response": ["r"]}, 4003, "field 'src' must be a list of strings, got str"),
        ({"src": ["s"], "tgt": None, "response": ["r"]}, 4003, "field 'tgt' must be a list of strings, got NoneType"),
        (
            {"src": ["s", "s"], "tgt": ["t", "t"], "response": ["r", 1]},
            4003,
            "field 'response' item 1 must be a string, got int",
        ),
        ({"src": ["s"], "tgt": [["t"]], "response": ["r"]}, 4003, "field 'tgt' item 0 must be a string, got list"),
        ({"src": ["s"] * 2, "tgt": ["t"] * 3, "response": ["r"] * 2}, 4005, "field 'tgt' has 3 items but 'src' has 2"),
        ({"src": ["s"] * 2, "tgt": ["t"] * 2, "response": ["r"]}, 4005, "field 'response' has 1 items but 'src' has 2"),
        ({"src": [], "tgt": [], "response": []}, 4004, "empty batch"),
        (ok_body(51), 4006, "batch has 51 items, more than max_batch=50"),
    ],
)
def test_malformed_body_is_400(reverse_server, body, code, fragment):
    resp = post(reverse_server, body)
    assert resp.status_code == 400, resp.text
    payload = resp.json()
    assert payload["error_code"] == code
    assert fragment in payload["error_msg"]
    assert "score" not in payload  # never made-up scores


def test_body_too_large_is_413(reverse_server):
    body = {"src": ["x" * 30000], "tgt": ["t"], "response": ["r"]}
    resp = post(reverse_server, body)
    assert resp.status_code == 413
    payload = resp.json()
    assert payload["error_code"] == 4013
    assert "max_body_bytes=20000" in payload["error_msg"]
    # the server keeps serving after a rejection
    assert post(reverse_server, ok_body(50)).json()["score"] == [1.0] * 50


def test_unknown_route_and_method_answer_json(reverse_server):
    resp = requests.get(reverse_server.url + "/nope", timeout=REQUEST_TIMEOUT_S)
    assert resp.status_code == 404 and resp.json()["error_code"] == 404
    resp = requests.get(reverse_server.url + "/", timeout=REQUEST_TIMEOUT_S)
    assert resp.status_code == 405 and resp.json()["error_code"] == 405


# ---------------------------------------------------------------- scorer failures


def test_scorer_exception_is_500_naming_the_item(flaky_server):
    resp = post(flaky_server, {"src": ["a", "b", "c"], "tgt": ["a", "b", "c"], "response": ["fine", "boom", "fine"]})
    assert resp.status_code == 500
    payload = resp.json()
    assert payload["error_code"] == 5001
    assert "item 1" in payload["error_msg"] and "scorer exploded on purpose" in payload["error_msg"]
    assert "score" not in payload


@pytest.mark.parametrize("bad", ["nan", "str"])
def test_scorer_bad_value_is_500(flaky_server, bad):
    resp = post(flaky_server, {"src": ["a", "b"], "tgt": ["a", "b"], "response": ["fine", bad]})
    assert resp.status_code == 500
    payload = resp.json()
    assert payload["error_code"] == 5002
    assert "item 1" in payload["error_msg"] and "finite number" in payload["error_msg"]


def test_flaky_server_scores_good_items(flaky_server):
    resp = post(flaky_server, {"src": ["a"], "tgt": ["a"], "response": ["fine"]})
    assert resp.status_code == 200 and resp.json()["score"] == [1.0]
    health = requests.get(flaky_server.url + "/health", timeout=REQUEST_TIMEOUT_S).json()
    assert health["scorer"] == "tests.test_reward_server:flaky_scorer"


# ---------------------------------------------------------------- load


def test_concurrent_load(reverse_server):
    """8 client threads x 200 requests of 4 items each: no error, every score right."""
    n_threads, n_requests = 8, 200
    latencies, errors = [], []
    lock = threading.Lock()
    body = {
        "src": ["Reverse: abc", "Reverse: k3x9q", "Reverse: 1234", "Reverse: 98765"],
        "tgt": ["cba", "q9x3k", "4321", "56789"],
        "response": ["cba", "wrong", "4321", "56789"],
    }
    expected = [1.0, 0.0, 1.0, 1.0]

    def worker():
        local, local_errors = [], []
        with requests.Session() as session:
            for _ in range(n_requests):
                t0 = time.perf_counter()
                try:
                    resp = session.post(reverse_server.url, json=body, timeout=REQUEST_TIMEOUT_S)
                    ok = resp.status_code == 200 and resp.json()["score"] == expected
                    if not ok:
                        local_errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")
                except requests.RequestException as err:
                    local_errors.append(repr(err))
                local.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(local)
            errors.extend(local_errors)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(n_threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    wall = time.perf_counter() - t0
    assert not any(t.is_alive() for t in threads), "load threads did not finish"
    assert errors == []
    assert len(latencies) == n_threads * n_requests
    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000

    print(
        json.dumps(
            {
                "bench": "reward_server_load",
                "threads": n_threads,
                "requests": len(latencies),
                "items_per_request": len(expected),
                "p50_ms": round(pct(50), 2),
                "p99_ms": round(pct(99), 2),
                "max_ms": round(latencies[-1] * 1000, 2),
                "requests_per_s": round(len(latencies) / wall, 1),
            }
        )
    )


# ---------------------------------------------------------------- start-up variants


def test_starts_from_inside_ppo_and_stops_cleanly():
    """The PaddleNLP habit: `cd ppo && python reward_server.py`; SIGTERM exits 0 with final counts."""
    server = ServerProcess("--scorer", "kk", cwd=os.path.join(ROOT, "ppo"), script="reward_server.py")
    try:
        assert requests.get(server.url + "/health", timeout=REQUEST_TIMEOUT_S).json()["scorer"] == "kk"
        body = {
            "src": ["who is a knight?"],
            "tgt": ["(1) Zoey is a knave\n(2) Oliver is a knight"],
            "response": ["<think>...</think><answer>(1) Zoey is a knave\n(2) Oliver is a knight</answer>"],
        }
        assert requests.post(server.url, json=body, timeout=REQUEST_TIMEOUT_S).json()["score"] == [3.0]
    finally:
        rc = server.stop()
    log = server.log_text()
    server.cleanup()
    assert rc == 0, log
    assert '"requests": 1' in log and "reward server stopped" in log


def test_default_scorer_is_kk_and_bad_scorer_fails_fast():
    from ppo.reward_server import parse_args

    args = parse_args([])
    assert (args.host, args.port, args.scorer, args.threads) == ("127.0.0.1", 8731, "kk", 8)
    proc = subprocess.run(
        [sys.executable, "ppo/reward_server.py", "--port", str(free_port()), "--scorer", "no_such_scorer"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "unknown scorer 'no_such_scorer'" in proc.stderr and "reverse" in proc.stderr


def test_server_and_client_do_not_import_paddle():
    code = (
        "import sys, ppo.reward_server, ppo.reward_client; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('paddle', 'paddlenlp')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_create_app_in_process():
    """The app factory with Flask's test client (no sockets): a registered scorer and limits."""
    from ppo.reward_server import create_app
    from ppo.scorers import register_scorer

    register_scorer("test_server_len", lambda src, tgt, response: float(len(response)))
    client = create_app("test_server_len", max_batch=2).test_client()
    resp = client.post("/", json={"src": ["a", "b"], "tgt": ["", ""], "response": ["xy", ""]})
    assert resp.status_code == 200 and resp.get_json()["score"] == [2.0, 0.0]
    resp = client.post("/", json={"src": ["a"] * 3, "tgt": [""] * 3, "response": [""] * 3})
    assert resp.status_code == 400 and resp.get_json()["error_code"] == 4006
    with pytest.raises(ValueError, match="unknown scorer"):
        create_app("no_such_scorer")
