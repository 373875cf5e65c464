"""RewardServerClient against the real server (subprocess) and a scripted loopback fake.

The fake answers from a script and counts hits, so retry counts are checked exactly
and replies the real server never sends (wrong length, NaN, error_code != 0 with
HTTP 200) can be tested. Backoffs are tiny; every server is stopped by its fixture.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ppo.serving.reward_client import RewardServerClient, RewardServerError
from tests.test_reward_server import ServerProcess, free_port

FAST = dict(timeout=5.0, max_retries=2, backoff=0.01)


@pytest.fixture(scope="module")
def reverse_server():
    server = ServerProcess("--scorer", "reverse")
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def flaky_server():
    server = ServerProcess("--scorer", "tests.test_reward_server:flaky_scorer")
    yield server
    server.cleanup()


class FakeServer:
    """Loopback HTTP server answering each request with the next scripted (status, body, delay_s)."""

    def __init__(self):
        self.script = []
        self.hits = 0
        self.bodies = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with fake.lock:
                    fake.hits += 1
                    fake.bodies.append(body)
                    status, payload, delay = fake.script.pop(0) if fake.script else (500, {"error_code": 1}, 0)
                if delay:
                    time.sleep(delay)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client timed out and went away

            do_POST = do_GET = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.stop()


def ok(scores):
    return (200, {"error_code": 0, "error_msg": "Success", "score": scores}, 0)


# ---------------------------------------------------------------- real server


def test_scores_from_real_server(reverse_server):
    with RewardServerClient(reverse_server.url, **FAST) as client:
        assert client.check_health() == {"status": "ok", "scorer": "reverse", "token_required": False}
        scores = client.score(["Reverse: abc", "Reverse: 123"], ["cba", "321"], ["cba", "312"])
        assert scores == [1.0, 0.0]
        assert all(isinstance(x, float) for x in scores)
        assert client.score([], [], []) == []


def test_server_down_raises_after_retries():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = RewardServerClient(url, timeout=2.0, max_retries=2, backoff=0.01)
    with pytest.raises(RewardServerError) as info:
        client.score(["s"], ["t"], ["r"])
    msg = str(info.value)
    assert url in msg and "3 attempt(s)" in msg and "ConnectionError" in msg
    assert info.value.attempts == 3
    with pytest.raises(RewardServerError, match="health check"):
        client.check_health()


def test_scorer_error_500_raises_with_server_message(flaky_server):
    client = RewardServerClient(flaky_server.url, **FAST)
    with pytest.raises(RewardServerError) as info:
        client.score(["a", "b"], ["a", "b"], ["fine", "boom"])
    msg = str(info.value)
    assert flaky_server.url in msg and "HTTP 500" in msg and "item 1" in msg and "3 attempt(s)" in msg


def test_4xx_raises_with_server_message(reverse_server):
    client = RewardServerClient(reverse_server.url, **FAST)
    with pytest.raises(RewardServerError) as info:
        client.score(["a"], ["a"], [7])  # not a string: the server answers 400
    assert info.value.status == 400 and info.value.error_code == 4003
    assert "field 'response' item 0 must be a string" in str(info.value)


def test_client_checks_lengths_before_posting():
    client = RewardServerClient("http://127.0.0.1:1", **FAST)
    with pytest.raises(ValueError, match="differ in length"):
        client.score(["a", "b"], ["a"], ["a", "b"])
    assert RewardServerClient("127.0.0.1:8731").url == "http://127.0.0.1:8731"  # PaddleNLP files give no scheme
    with pytest.raises(ValueError, match="http://"):
        RewardServerClient("ftp://127.0.0.1:8731")


# ---------------------------------------------------------------- scripted fake


def test_posts_paddlenlp_contract_and_recovers_from_5xx(fake):
    fake.script = [(503, {"error_code": 5001, "error_msg": "busy"}, 0), (502, b"bad gateway", 0), ok([0.5, -1.0])]
    client = RewardServerClient(fake.url, **FAST)
    assert client.score(["s1", "s2"], ["t1", "t2"], ["r1", "r2"]) == [0.5, -1.0]
    assert fake.hits == 3
    assert json.loads(fake.bodies[-1]) == {"src": ["s1", "s2"], "tgt": ["t1", "t2"], "response": ["r1", "r2"]}


def test_5xx_every_time_raises_after_all_attempts(fake):
    fake.script = [(500, {"error_code": 5001, "error_msg": "scorer 'x' raised on item 0"}, 0)] * 3
    client = RewardServerClient(fake.url, **FAST)
    with pytest.raises(RewardServerError) as info:
        client.score(["s"], ["t"], ["r"])
    assert fake.hits == 3
    assert "scorer 'x' raised on item 0" in str(info.value) and fake.url in str(info.value)


def test_4xx_is_not_retried(fake):
    fake.script = [(400, {"error_code": 4006, "error_msg": "batch has 9 items, more than max_batch=8"}, 0)]
    client = RewardServerClient(fake.url, **FAST)
    with pytest.raises(RewardServerError, match="max_batch=8") as info:
        client.score(["s"], ["t"], ["r"])
    assert fake.hits == 1 and info.value.status == 400 and info.value.error_code == 4006


def test_timeout_is_retried(fake):
    fake.script = [(200, {"error_code": 0, "error_msg": "Success", "score": [1.0]}, 1.0), ok([2.0])]
    client = RewardServerClient(fake.url, timeout=0.3, max_retries=1, backoff=0.01)
    assert client.score(["s"], ["t"], ["r"]) == [2.0]
    assert fake.hits == 2


@pytest.mark.parametrize(
    "reply, fragment",
    [
        ((200, {"error_code": 0, "error_msg": "Success", "score": [1.0]}, 0), "'score' has 1 values for 2 items"),
        ((200, {"error_code": 0, "error_msg": "Success", "score": [1.0, 2.0, 3.0]}, 0), "'score' has 3 values"),
        ((200, {"error_code": 0, "error_msg": "Success"}, 0), "'score' must be a list"),
        ((200, {"error_code": 500, "error_msg": "oops", "score": [0, 0]}, 0), "error_code 500"),  # PaddleNLP's zeros
        ((200, b'{"error_code": 0, "score": [1.0, NaN]}', 0), "score 1 is nan"),
        ((200, {"error_code": 0, "score": [1.0, "2"]}, 0), "score 1 is '2'"),
        ((200, {"error_code": 0, "score": [1.0, True]}, 0), "score 1 is True"),
        ((200, b"<html>not json</html>", 0), "not JSON"),
        ((200, [1.0, 2.0], 0), "expected a JSON object"),
    ],
)
def test_invalid_reply_raises_without_retry(fake, reply, fragment):
    fake.script = [reply]
    client = RewardServerClient(fake.url, **FAST)
    with pytest.raises(RewardServerError) as info:
        client.score(["s1", "s2"], ["t1", "t2"], ["r1", "r2"])
    assert fragment in str(info.value) and fake.url in str(info.value)
    assert fake.hits == 1


def test_unhealthy_reply(fake):
    fake.script = [(200, {"status": "starting"}, 0)]
    with pytest.raises(RewardServerError, match="not healthy"):
        RewardServerClient(fake.url, **FAST).check_health()
