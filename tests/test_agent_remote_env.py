"""`env_name remote`: an environment served by `paddle-align env-server` (ppo/agents/env_server.py)
and used over HTTP (ppo/agents/remote_env.py): the same answers as the class run locally,
retries that never step an environment twice, a refused token and a dead server each one clear
error, and a GRPO run through ppo/run_ppo.py against a server process with the metrics of the
same run on the local class."""
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import requests
import waitress

from ppo.agents import make_environment
from ppo.agents.env_server import create_app
from ppo.agents.remote_env import TOKEN_ENV, RemoteEnvError, RemoteEnvironment
from tests.agent_helpers import EchoEnv
from tests.test_agent_training import grpo_agent_argv
from tests.test_ppo_trainer import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ECHO = "tests.agent_helpers:EchoEnv"


class LosesReplies:
    """WSGI middleware: the first `n` step requests run on the app, then their reply is lost
    (HTTP 503 instead), as a reply dropped by the network after the environment stepped."""

    def __init__(self, app, n):
        self.app, self.n, self.requests = app, n, []

    def __call__(self, environ, start_response):
        self.requests.append((environ["REQUEST_METHOD"], environ["PATH_INFO"]))
        if environ["PATH_INFO"].endswith("/step") and self.n > 0:
            self.n -= 1
            body = b"".join(self.app(environ, lambda *a, **k: None))
            assert b"observation" in body  # the environment did step
            start_response("503 Service Unavailable", [("Content-Type", "application/json")])
            return [b'{"error_msg": "reply lost"}']
        return self.app(environ, start_response)


@pytest.fixture
def serve():
    servers = []

    def start(app):
        server = waitress.create_server(app, host="127.0.0.1", port=0, threads=4)
        threading.Thread(target=server.run, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.effective_port}"

    yield start
    for server in servers:
        server.close()


def sessions(app):
    return app.extensions["env_sessions"].snapshot()


def test_a_remote_environment_answers_as_the_local_class(serve):
    app = create_app(ECHO, {"turns": 3, "answer": "xy"})
    remote = RemoteEnvironment(serve(app), backoff=0.0)
    local = EchoEnv(turns=3, answer="xy")
    record = {"src": "hello", "tgt": "1", "i": 1}
    assert remote.reset(record) == local.reset(record) == "hello"
    assert remote.stop_strings == [] and remote.tools == [] and remote.served == ECHO
    for _ in range(3):
        got, want = remote.step("call"), local.step("call")
        assert got[:3] == want[:3]
        assert got[3].get("tool_calls", []) == want[3].get("tool_calls", []) and got[3]["role"] == "tool"
    assert got[2] is True and sessions(app)["open"] == 1
    remote.close()
    assert sessions(app) == {"opened": 1, "closed": 1, "expired": 0, "steps": 3, "step_replays": 0, "errors": 0, "open": 0}


def test_a_lost_reply_is_retried_without_stepping_the_environment_twice(serve):
    """Two step replies lost in a row: the client retries (HTTP 503), the server replays the
    reply of the step number it already ran; the episode goes on as if nothing was lost."""
    app = create_app(ECHO, {"turns": 3})
    lossy = LosesReplies(app, 2)
    remote = RemoteEnvironment(serve(lossy), max_retries=2, backoff=0.0)
    remote.reset({"src": "s", "i": 0})
    assert remote.step("a")[:3] == ("ans", 0.5, False)
    assert remote.step("b")[:3] == ("ans", 0.5, False)  # not the episode's end: step 1 ran once
    assert sessions(app)["steps"] == 2 and sessions(app)["step_replays"] == 2
    assert [p for m, p in lossy.requests if p.endswith("/step")].__len__() == 4
    lossy.n = 5
    with pytest.raises(RemoteEnvError) as err:
        remote.step("c")
    assert "failed after 3 attempt(s); last error: HTTP 503: reply lost" in str(err.value)
    remote.close()


def test_a_wrong_or_missing_token_is_refused_at_once(serve, monkeypatch):
    app = create_app(ECHO, token="s3cret")
    url = serve(app)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(RemoteEnvError) as err:
        RemoteEnvironment(url)
    assert "requires a token and refuses this client's: missing 'Authorization: Bearer <token>' header" in str(err.value)
    with pytest.raises(RemoteEnvError) as err:
        RemoteEnvironment(url, token="guess")
    assert "wrong bearer token" in str(err.value) and TOKEN_ENV in str(err.value)
    answer = requests.post(url + "/sessions", json={"session": "x", "record": {"src": "s"}}, timeout=30)
    assert answer.status_code == 401 and sessions(app)["opened"] == 0
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    env = RemoteEnvironment(url)
    assert env.reset({"src": "ok"}) == "ok" and sessions(app)["opened"] == 1
    env.close()


@pytest.mark.slow
def test_a_dead_server_stops_the_run_with_one_line_before_models_load(tiny_model_dir, tiny_data_dir, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    kwargs = json.dumps({"url": f"127.0.0.1:{port}", "max_retries": 1, "backoff": 0.0})
    argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "dead"), "--env_name", "remote",
                           "--env_kwargs", kwargs)
    proc = subprocess.run([sys.executable, "ppo/run_ppo.py", *argv], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert f"RemoteEnvError: no environment server answers at http://127.0.0.1:{port} (connection refused, 2 attempt(s))" \
        in errors[0]
    assert not os.path.exists(str(tmp_path / "dead" / "resolved_arguments.json"))


def start_env_server(log_path, *flags):
    """`paddle-align env-server ... --port 0` as a process; returns (process, its URL) once it listens."""
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "ppo.cli", "env-server", "--port", "0", *flags], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)
    while proc.poll() is None:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", open(log_path).read())
        if found:
            return proc, found.group(1)
        time.sleep(0.2)
    raise AssertionError(open(log_path).read()[-3000:])


RUN_METRICS = ("objective/scores", "agent/turns_mean", "agent/tool_calls_mean", "tool/echo/calls",
               "agent/env_reward_mean", "response_length/mean", "loss/policy_avg")


@pytest.mark.slow
def test_a_remote_environment_server_drives_a_grpo_run(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """ppo/run_ppo.py, 2 GRPO steps, against `paddle-align env-server` serving the echo class
    (with a token): every trajectory was a session on the server, opened and closed, and the
    run's metrics equal those of the same run with the class in the trainer's process."""
    monkeypatch.setenv(TOKEN_ENV, "t0ken")
    server, url = start_env_server(str(tmp_path / "server.log"), "--env_name", ECHO, "--env_kwargs", '{"turns": 3}')
    try:
        outs = {}
        for kind, env in (("remote", ["--env_name", "remote", "--env_kwargs", json.dumps({"url": url})]), ("local", [])):
            outs[kind] = str(tmp_path / kind)
            argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, outs[kind], "--max_steps", "2", *env)
            proc = subprocess.run([sys.executable, "ppo/run_ppo.py", *argv], cwd=ROOT, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-3000:]
        health = requests.get(url + "/health", timeout=30).json()
    finally:
        server.terminate()
        server.wait()
    steps = {kind: [r for r in read_metrics(out) if "agent/turns_mean" in r] for kind, out in outs.items()}
    assert [r["step"] for r in steps["remote"]] == [1, 2]
    for remote, local in zip(steps["remote"], steps["local"]):
        assert {k: remote[k] for k in RUN_METRICS} == pytest.approx({k: local[k] for k in RUN_METRICS}, rel=1e-6, abs=1e-8)
        assert remote["tool/echo/calls"] == 16.0 and remote["agent/tool_calls_mean"] == 2.0
    counts = health["sessions"]
    assert counts["opened"] == counts["closed"] == 16 and counts["open"] == 0 and counts["errors"] == 0
    turns = sum(r["agent/turns_mean"] * 8 for r in steps["remote"])
    assert counts["steps"] == turns  # one env.step per policy turn, each run once
    assert "environment server stopped" in open(str(tmp_path / "server.log")).read()
