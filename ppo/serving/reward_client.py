"""Trainer-side client of the HTTP reward server (``ppo/reward_server.py``).

PaddleNLP's ``request_reward_server`` posts ``{"src", "tgt", "response"}`` to the
URL and, when anything goes wrong, logs a warning and trains on zero rewards.
This client never does that: it retries what may be transient (connection
errors, timeouts, HTTP 5xx) with exponential backoff, and otherwise raises
:class:`RewardServerError` with the URL, the attempts made and the last error.

    client = RewardServerClient("http://127.0.0.1:8731", timeout=60, max_retries=3)
    client.check_health()                         # {"status": "ok", "scorer": "kk"}; a probe without /health
    scores = client.score(src, tgt, response)     # list of finite floats, one per item

Retry policy: ``1 + max_retries`` attempts in all; before retry k (k = 1, 2, ...)
the client sleeps ``backoff * 2 ** (k - 1)`` seconds. A 4xx answer (the request
itself is wrong) raises at once with the server's ``error_msg``. A 200 answer that
breaks the contract (``error_code`` not 0, ``score`` missing, of the wrong
length, or holding a non-number / NaN / inf) raises at once too.
An empty batch returns ``[]`` without a request. With a ``token`` (or the
``PPO_REWARD_SERVER_TOKEN`` environment variable) every request carries
``Authorization: Bearer <token>``; a 401 answer raises at once. A client holds one
``requests.Session``: use one client per thread. This module imports only
``requests`` (no paddle).
"""
import logging
import math
import os
import time
import urllib.parse
from typing import List, Sequence

import requests

from ..common.urls import normalize_url

logger = logging.getLogger("ppo.reward_client")
TOKEN_ENV = "PPO_REWARD_SERVER_TOKEN"  # the server reads the same variable


class RewardServerError(RuntimeError):
    """The reward server could not produce valid scores; the message says why."""

    def __init__(self, message, url=None, attempts=None, status=None, error_code=None):
        super().__init__(message)
        self.url = url
        self.attempts = attempts
        self.status = status
        self.error_code = error_code


def _server_message(resp):
    """`error_msg` (and `error_code`) of an answer, or the start of its raw text."""
    try:
        payload = resp.json()
    except ValueError:
        return None, resp.text[:500]
    if isinstance(payload, dict) and "error_msg" in payload:
        return payload.get("error_code"), str(payload["error_msg"])
    return None, resp.text[:500]


class RewardServerClient:
    """Client of one reward server URL (``http://host:port``; scores are posted to it)."""

    def __init__(
        self, url: str, timeout: float = 60.0, max_retries: int = 3, backoff: float = 0.5, session=None, token=None
    ):
        url = normalize_url(url)
        if timeout <= 0 or max_retries < 0 or backoff < 0:
            raise ValueError(
                f"need timeout > 0, max_retries >= 0, backoff >= 0; got {timeout}, {max_retries}, {backoff}"
            )
        self.url = url
        self.timeout = timeout
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self._session = session if session is not None else requests.Session()
        token = token or os.environ.get(TOKEN_ENV)
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    # The base URL posts to itself (PaddleNLP's `POST /`); health lives beside it.
    @property
    def health_url(self) -> str:
        return self.url.rstrip("/") + "/health"

    def close(self):
        self._session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _request(self, method, url, what, **kwargs):
        """Send with retries on connection errors, timeouts and 5xx; return the 2xx/4xx response."""
        attempts = 1 + self.max_retries
        last_error = None
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                delay = self.backoff * 2 ** (attempt - 2)
                logger.warning(
                    "%s %s failed (attempt %d/%d: %s); retrying in %.2fs",
                    what,
                    url,
                    attempt - 1,
                    attempts,
                    last_error,
                    delay,
                )
                time.sleep(delay)
            try:
                resp = self._session.request(method, url, timeout=self.timeout, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as err:
                last_error = f"{type(err).__name__}: {err}"
                continue
            if resp.status_code >= 500:
                code, msg = _server_message(resp)
                last_error = f"HTTP {resp.status_code} (error_code {code}): {msg}"
                continue
            return resp
        raise RewardServerError(
            f"{what} {url} failed after {attempts} attempt(s); last error: {last_error}", url=url, attempts=attempts
        )

    def score(self, src: Sequence[str], tgt: Sequence[str], response: Sequence[str]) -> List[float]:
        """One finite float per item, in order; raises RewardServerError otherwise."""
        src, tgt, response = list(src), list(tgt), list(response)
        if not (len(src) == len(tgt) == len(response)):
            raise ValueError(f"src, tgt and response differ in length: {len(src)}, {len(tgt)}, {len(response)}")
        if not src:
            return []
        payload = {"src": src, "tgt": tgt, "response": response}
        resp = self._request("POST", self.url, "reward request to", json=payload)
        if resp.status_code != 200:
            code, msg = _server_message(resp)
            raise RewardServerError(
                f"reward server {self.url} refused the request: HTTP {resp.status_code} (error_code {code}): {msg}",
                url=self.url,
                status=resp.status_code,
                error_code=code,
            )
        return self._validate_scores(resp, len(src))

    def _validate_scores(self, resp, n) -> List[float]:
        def bad(why):
            msg = f"reward server {self.url} sent an invalid reply: {why}"
            return RewardServerError(msg, url=self.url, status=200)

        try:
            payload = resp.json()
        except ValueError:
            raise bad(f"not JSON: {resp.text[:200]!r}") from None
        if not isinstance(payload, dict):
            raise bad(f"expected a JSON object, got {type(payload).__name__}")
        code = payload.get("error_code")
        if code != 0:
            raise bad(f"error_code {code!r}: {payload.get('error_msg')!r}")
        scores = payload.get("score")
        if not isinstance(scores, list):
            raise bad(f"'score' must be a list, got {type(scores).__name__}")
        if len(scores) != n:
            raise bad(f"'score' has {len(scores)} values for {n} items")
        out = []
        for i, value in enumerate(scores):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(f"score {i} is {value!r}, not a finite number")
            out.append(float(value))
        return out

    PROBE = {"src": ["1 + 1 = ?"], "tgt": ["2"], "response": ["2"]}
    """The one-item request that checks a server without `/health` (PaddleNLP's contract: only `POST /`)."""

    def check_health(self) -> dict:
        """``GET /health`` (with the same retries); returns its JSON, raises RewardServerError if unhealthy.

        A server that has no ``/health`` (HTTP 404 or 405, as one written to PaddleNLP's
        contract of only ``POST /``) is checked with one probe request scored through
        :meth:`score` instead; returns ``{"status": "ok", "probe_score": s}`` then."""
        resp = self._request("GET", self.health_url, "health check of")
        if resp.status_code in (404, 405):
            logger.info("%s answers HTTP %d: checking the server with one probe request", self.health_url, resp.status_code)
            (score,) = self.score(self.PROBE["src"], self.PROBE["tgt"], self.PROBE["response"])
            return {"status": "ok", "probe_score": score}
        try:
            payload = resp.json()
        except ValueError:
            payload = None
        if resp.status_code != 200 or not isinstance(payload, dict) or payload.get("status") != "ok":
            raise RewardServerError(
                f"reward server {self.health_url} is not healthy: HTTP {resp.status_code}: {resp.text[:200]}",
                url=self.health_url,
                status=resp.status_code,
            )
        if payload.get("token_required") and payload.get("token_accepted") is False:
            raise RewardServerError(
                f"reward server {self.url} requires a token and refuses this client's: {payload.get('token_problem')}; "
                f"set reward_server_token (or ${TOKEN_ENV}) to the server's token",
                url=self.health_url, status=401,
            )
        return payload


STARTUP_TIMEOUT_S = 10.0
"""Longest wait for the reward server's answer in the start-up check (one attempt, no retries)."""


def _short_reason(error):
    """The part of a `requests` failure a user acts on (`connection refused`, a timeout)."""
    text = str(error)
    for phrase in ("Connection refused", "Name or service not known", "timed out", "No route to host"):
        if phrase in text:
            return phrase.lower()
    return text[-300:]


def startup_problem(url, token=None, timeout=STARTUP_TIMEOUT_S):
    """None when a reward server answers at `url` and accepts `token` (or $PPO_REWARD_SERVER_TOKEN),
    else one line saying what is wrong: checked once, without retries, before any model loads
    (a wrong token is otherwise found at the first scoring request)."""
    try:
        url = normalize_url(url)
    except ValueError as err:
        return f"reward_server: {err}"
    port = urllib.parse.urlsplit(url).port or 8731
    try:
        with RewardServerClient(url, timeout=timeout, max_retries=0, token=token) as client:
            client.check_health()
    except RewardServerError as err:
        if err.status is None and ("ConnectionError" in str(err) or "Timeout" in str(err)):  # no answer at all
            return (f"reward_server {url}: no reward server answers there ({_short_reason(err)}); start it first, e.g. "
                    f"python ppo/reward_server.py --port {port} --scorer NAME (use_rm_server true needs it)")
        return f"reward_server {url}: {err}"
    return None


def run_server_problems(model_args):
    """`[startup_problem(...)]` of a run's `use_rm_server`, `reward_server`, `reward_server_token` and
    `reward_server_timeout` (PPO/GRPO, online DPO); [] without a reward server."""
    if not model_args.use_rm_server:
        return []
    timeout = min(model_args.reward_server_timeout, STARTUP_TIMEOUT_S)
    return [p for p in [startup_problem(model_args.reward_server, model_args.reward_server_token, timeout)] if p]


def score_once(url: str, src, tgt, response, **kwargs) -> List[float]:
    """Convenience: score one batch with a throw-away client."""
    with RewardServerClient(url, **kwargs) as client:
        return client.score(src, tgt, response)


__all__ = ["RewardServerClient", "RewardServerError", "normalize_url", "run_server_problems", "score_once", "startup_problem"]
