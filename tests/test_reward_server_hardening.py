"""Reward server hardening: unparseable bodies are 400, numpy scores are numbers, a bearer
token guards scoring (server flag or environment variable, sent by the trainer's client),
a bind beyond loopback is warned about, and `--connection_limit` reaches waitress."""
import socket

import numpy as np
import pytest
import requests

from ppo.serving.reward_client import RewardServerClient, RewardServerError
from ppo.reward_server import create_app, parse_args
from ppo.scorers import register_scorer
from tests.test_reward_server import REQUEST_TIMEOUT_S, ServerProcess

BODY = {"src": ["Reverse: ab"], "tgt": ["ba"], "response": ["ba"]}


def numpy_scorer(src, tgt, response):
    """np.float32 for a normal answer, np.float32 inf for 'huge'."""
    return np.float32(np.inf) if response == "huge" else np.float32(0.5)


register_scorer("test_numpy_scorer", numpy_scorer)


def test_deeply_nested_body_is_400_not_500():
    """json.loads raises RecursionError (not ValueError) on deep nesting; that is a bad body, not a server fault."""
    client = create_app("reverse").test_client()
    resp = client.post("/", data="[" * 200000 + "]" * 200000, content_type="application/json")
    assert resp.status_code == 400
    assert resp.get_json()["error_code"] == 4001 and "nested too deeply" in resp.get_json()["error_msg"]


def test_numpy_float_score_is_accepted_and_inf_still_refused():
    client = create_app("test_numpy_scorer").test_client()
    resp = client.post("/", json={"src": ["a", "b"], "tgt": ["", ""], "response": ["x", "y"]})
    assert resp.status_code == 200 and resp.get_json()["score"] == [0.5, 0.5]
    resp = client.post("/", json={"src": ["a", "b"], "tgt": ["", ""], "response": ["x", "huge"]})
    assert resp.status_code == 500 and resp.get_json()["error_code"] == 5002 and "item 1" in resp.get_json()["error_msg"]


def test_token_guards_scoring_but_not_health():
    client = create_app("reverse", token="s3cret").test_client()
    assert client.get("/health").status_code == 200
    for headers, why in [({}, "missing"), ({"Authorization": "Bearer nope"}, "wrong"), ({"Authorization": "s3cret"}, "Bearer")]:
        resp = client.post("/", json=BODY, headers=headers)
        assert resp.status_code == 401, headers
        assert resp.get_json()["error_code"] == 4010 and why in resp.get_json()["error_msg"]
    resp = client.post("/", json=BODY, headers={"Authorization": "Bearer s3cret"})
    assert resp.status_code == 200 and resp.get_json()["score"] == [1.0]


def test_health_check_finds_a_wrong_or_missing_token_at_start(monkeypatch):
    monkeypatch.delenv("PPO_REWARD_SERVER_TOKEN", raising=False)
    app = create_app("reverse", token="s3cret").test_client()
    assert app.get("/health").get_json() == {"status": "ok", "scorer": "reverse", "token_required": True,
                                             "token_accepted": False, "token_problem": app.get("/health").get_json()["token_problem"]}
    assert app.get("/health", headers={"Authorization": "Bearer s3cret"}).get_json()["token_accepted"] is True
    assert create_app("reverse").test_client().get("/health").get_json()["token_required"] is False
    server = ServerProcess("--scorer", "reverse", "--token", "s3cret")
    try:
        for token, why in [("nope", "wrong bearer token"), (None, "missing")]:
            with RewardServerClient(server.url, timeout=5.0, max_retries=0, token=token) as client:
                with pytest.raises(RewardServerError, match=rf"requires a token and refuses this client's: .*{why}"):
                    client.check_health()
        with RewardServerClient(server.url, timeout=5.0, max_retries=0, token="s3cret") as client:
            assert client.check_health()["token_accepted"] is True
    finally:
        server.cleanup()


def test_client_sends_the_token_from_its_argument_or_the_environment(monkeypatch):
    monkeypatch.setenv("PPO_REWARD_SERVER_TOKEN", "from-env")
    server = ServerProcess("--scorer", "reverse")  # the server reads the same variable
    try:
        assert requests.get(server.url + "/health", timeout=REQUEST_TIMEOUT_S).status_code == 200
        assert requests.post(server.url, json=BODY, timeout=REQUEST_TIMEOUT_S).status_code == 401
        with RewardServerClient(server.url, timeout=5.0, max_retries=0) as client:
            assert client.score(*BODY.values()) == [1.0]
        monkeypatch.delenv("PPO_REWARD_SERVER_TOKEN")
        with RewardServerClient(server.url, timeout=5.0, max_retries=0, token="from-env") as client:
            assert client.score(*BODY.values()) == [1.0]
        with RewardServerClient(server.url, timeout=5.0, max_retries=0) as client:
            with pytest.raises(RewardServerError, match=r"HTTP 401 \(error_code 4010\).*token"):
                client.score(*BODY.values())
        assert "token=required" in server.log_text()
    finally:
        server.cleanup()


def test_bind_beyond_loopback_warns_and_token_flag_is_honoured():
    server = ServerProcess("--scorer", "reverse", "--host", "0.0.0.0", "--token", "flagtoken")
    try:
        ok = requests.post(server.url, json=BODY, headers={"Authorization": "Bearer flagtoken"}, timeout=REQUEST_TIMEOUT_S)
        assert ok.status_code == 200
        assert requests.post(server.url, json=BODY, timeout=REQUEST_TIMEOUT_S).status_code == 401
        assert "WARNING" in server.log_text() and "reachable from other machines" in server.log_text()
    finally:
        server.cleanup()
    loopback = ServerProcess("--scorer", "reverse")
    try:
        assert "reachable from other machines" not in loopback.log_text()
    finally:
        loopback.cleanup()


def test_connection_limit_flag_lets_idle_sockets_not_starve_clients():
    """150 idle keep-alive sockets: waitress' default limit (100) would starve the next client."""
    assert parse_args([]).connection_limit >= 1000
    server = ServerProcess("--scorer", "reverse", "--connection_limit", "400")
    idle = []
    try:
        assert "connection_limit=400" in server.log_text()
        for _ in range(150):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        resp = requests.post(server.url, json=BODY, timeout=REQUEST_TIMEOUT_S)
        assert resp.status_code == 200 and resp.json()["score"] == [1.0]
    finally:
        for s in idle:
            s.close()
        server.cleanup()
