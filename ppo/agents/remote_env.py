"""``remote``: an environment that runs in another process or on another machine, over HTTP.

The trainer's side of ``paddle-align env-server`` (ppo/agents/env_server.py, which serves any
environment class of this package's registry). In the argument file::

    "env_name": "remote",
    "env_kwargs": {"url": "http://10.0.0.5:8741", "timeout_s": 120, "max_retries": 3}

One instance is one session on the server (one trajectory): ``reset(record)`` opens it,
``step(action_text)`` runs the served environment's ``step``, ``close()`` ends it. The served
environment's ``tools``, ``stop_strings`` and observation role come from ``GET /health`` when
the instance is built, so the rollout treats it exactly as the same class run locally.

Contract (JSON bodies; every route but ``/health`` needs ``Authorization: Bearer <token>``
when the server has a token):

- ``GET /health`` -> ``{"status": "ok", "env_name", "tools", "stop_strings", "observation_role",
  "token_required", "token_accepted"?, "sessions": {...}}``;
- ``POST /sessions`` ``{"session": id, "record": {...}, "env_kwargs": {...}}`` ->
  ``{"session": id, "observation": str | [messages]}``;
- ``POST /sessions/<id>/step`` ``{"action": str, "seq": k}`` -> ``{"observation", "reward",
  "done", "info"}``;
- ``DELETE /sessions/<id>`` -> ``{"closed": true}``.

Retries (as ppo/serving/reward_client.py): connection errors, timeouts and HTTP 5xx are retried
``max_retries`` times with backoff ``backoff * 2 ** (k - 1)`` seconds. They are safe: the
client names the session (a random id) and numbers its steps (``seq``), and the server answers
a repeated ``POST /sessions`` or step of the same number with the reply it already gave,
without running the environment again. A 4xx answer (401: a wrong or missing token) raises
:class:`RemoteEnvError` at once; so does a server that never answers, with one line that says
so (the start-up pass builds one instance, so a dead server stops the run before any model
loads). The token: ``token`` in ``env_kwargs`` or, better (argument files get copied), the
``PPO_ENV_SERVER_TOKEN`` environment variable. This module imports only ``requests``.
"""
import json
import logging
import os
import time
import uuid

import requests

from ..common.registry_settings import Setting
from ..common.urls import normalize_url
from .environment import Environment, EnvironmentFacts, register_environment

logger = logging.getLogger("ppo.agents.remote_env")
TOKEN_ENV = "PPO_ENV_SERVER_TOKEN"  # the server reads the same variable


class RemoteEnvError(RuntimeError):
    """The environment server could not do what was asked; the message says why."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def _reason(error):
    """The part of a `requests` failure a user acts on (connection refused, a timeout)."""
    text = f"{type(error).__name__}: {error}"
    for phrase in ("Connection refused", "Name or service not known", "timed out", "No route to host"):
        if phrase in text:
            return phrase.lower()
    return text[-300:]


def _error_text(resp):
    try:
        payload = resp.json()
    except ValueError:
        return resp.text[:300]
    return str(payload.get("error_msg", payload)) if isinstance(payload, dict) else resp.text[:300]


def _jsonable(record):
    """`record` as JSON can carry it (values JSON cannot hold become their text)."""
    return json.loads(json.dumps(dict(record), default=str))


class RemoteClient:
    """One requests session to one environment server, with retries (see the module docstring)."""

    def __init__(self, url, token=None, timeout_s=60.0, max_retries=3, backoff=0.5):
        self.url = normalize_url(url).rstrip("/")
        if not timeout_s > 0 or max_retries < 0 or backoff < 0:
            raise ValueError(f"need timeout_s > 0, max_retries >= 0, backoff >= 0; got {timeout_s}, {max_retries}, {backoff}")
        self.timeout_s, self.max_retries, self.backoff = float(timeout_s), int(max_retries), float(backoff)
        self.http = requests.Session()
        token = token or os.environ.get(TOKEN_ENV)
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    def request(self, method, path, what, payload=None):
        """The JSON answer of `method path`; retried on connection errors, timeouts and 5xx;
        RemoteEnvError on a 4xx answer or when every attempt failed."""
        url, attempts, last = self.url + path, 1 + self.max_retries, None
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                delay = self.backoff * 2 ** (attempt - 2)
                logger.warning("%s %s failed (attempt %d/%d: %s); retrying in %.2fs", what, url, attempt - 1, attempts,
                               last, delay)
                time.sleep(delay)
            try:
                resp = self.http.request(method, url, json=payload, timeout=self.timeout_s)
            except (requests.ConnectionError, requests.Timeout) as err:
                last = _reason(err)
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {_error_text(resp)}"
                continue
            if resp.status_code >= 400:
                hint = f"; set ${TOKEN_ENV} (or token in env_kwargs) to the server's token" if resp.status_code == 401 else ""
                raise RemoteEnvError(f"environment server {self.url} refused {what}: HTTP {resp.status_code}: "
                                     f"{_error_text(resp)}{hint}", status=resp.status_code)
            try:
                return resp.json()
            except ValueError:
                raise RemoteEnvError(f"environment server {self.url} answered {what} with no JSON: {resp.text[:200]!r}",
                                     status=resp.status_code) from None
        if last and not last.startswith("HTTP"):
            raise RemoteEnvError(f"no environment server answers at {self.url} ({last}, {attempts} attempt(s)); start it "
                                 "first, e.g. paddle-align env-server --env_name NAME --port PORT")
        raise RemoteEnvError(f"{what} {url} failed after {attempts} attempt(s); last error: {last}")

    def health(self):
        """`GET /health`, with the token checked (RemoteEnvError when the server refuses it)."""
        facts = self.request("GET", "/health", "the health check")
        if facts.get("status") != "ok":
            raise RemoteEnvError(f"environment server {self.url} is not healthy: {facts}")
        if facts.get("token_required") and facts.get("token_accepted") is False:
            raise RemoteEnvError(f"environment server {self.url} requires a token and refuses this client's: "
                                 f"{facts.get('token_problem')}; set ${TOKEN_ENV} (or token in env_kwargs) to the "
                                 "server's token", status=401)
        return facts

    def close(self):
        self.http.close()


SETTINGS = (
    Setting("url", str, None, "The environment server (http://host:port; required)."),
    Setting("env_kwargs", dict, None, "The served class's constructor arguments for this session (None: the server's "
            "own)."),
    Setting("token", str, None, "The server's bearer token (None: $PPO_ENV_SERVER_TOKEN, or none)."),
    Setting("timeout_s", float, 60.0, "Seconds of one request.", bounds=(0.0, False, None, False)),
    Setting("max_retries", int, 3, "Retries of a request that failed (a connection error, a timeout, HTTP 5xx).", bounds=(0, True, None, False)),
    Setting("backoff", float, 0.5, "Seconds before the first retry (doubling before each next one).", bounds=(0.0, True, None, False)),
)


@register_environment("remote", facts=EnvironmentFacts(
    summary="an environment served over HTTP by paddle-align env-server (ppo/agents/env_server.py)",
    observation_role="tool", settings=SETTINGS,
    startup_resets=0))  # a reset opens a session on the server: the start-up check starts none
class RemoteEnvironment(Environment):
    """One trajectory's session on an environment server (see the module docstring). `url`: the
    server; `env_kwargs`: passed to the served class's constructor for this session (the
    server's own options by default); `token`, `timeout_s` (per request), `max_retries`,
    `backoff`: as ppo/serving/reward_client.py's."""

    def __init__(self, url, env_kwargs=None, token=None, timeout_s=60.0, max_retries=3, backoff=0.5):
        if env_kwargs is not None and not isinstance(env_kwargs, dict):
            raise ValueError(f"env_kwargs of the remote environment must be a JSON object, got {env_kwargs!r}")
        self.client = RemoteClient(url, token, timeout_s, max_retries, backoff)
        self.env_kwargs = env_kwargs
        self.session, self.seq = None, 0
        try:
            facts = self.client.health()
        except Exception:
            self.client.close()
            raise
        self.served = facts.get("env_name")
        self.tools = list(facts.get("tools") or [])
        self.stop_strings = list(facts.get("stop_strings") or [])
        self.role = facts.get("observation_role", "tool")

    def reset(self, record):
        """Open this instance's session on the server; returns the served environment's first observation."""
        if self.session is not None:
            self.close()
        session = uuid.uuid4().hex
        payload = {"session": session, "record": _jsonable(record)}
        if self.env_kwargs is not None:
            payload["env_kwargs"] = self.env_kwargs
        reply = self.client.request("POST", "/sessions", "opening a session", payload)
        self.session, self.seq = session, 0
        return reply["observation"]

    def step(self, action_text):
        """`(observation, reward, done, info)` of the served environment's step."""
        if self.session is None:
            raise RemoteEnvError("step before reset: the remote environment has no session")
        self.seq += 1
        reply = self.client.request("POST", f"/sessions/{self.session}/step", f"step {self.seq} of session {self.session}",
                                    {"action": action_text, "seq": self.seq})
        info = dict(reply.get("info") or {})
        info.setdefault("role", self.role)
        return reply.get("observation"), float(reply.get("reward", 0.0)), bool(reply.get("done")), info

    def close(self):
        """End the session on the server (a failure to do so is logged, not raised: the episode is over)."""
        session, self.session = self.session, None
        if session is not None:
            try:
                self.client.request("DELETE", f"/sessions/{session}", f"closing session {session}")
            except RemoteEnvError as err:
                logger.warning("%s", err)
        self.client.close()
