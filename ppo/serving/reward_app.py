"""The reward server's Flask app (`create_app`): the request checks, the token check, the
scoring of a batch and the request counts; `ppo/reward_server.py` is its command line (the
contract and the errors are in its docstring). This module does not import paddle."""

import json
import logging
import threading
import time

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from ppo.common.bearer import check_token
from ppo.scorers import ScorerError, WeightedScorer

logger = logging.getLogger("ppo.reward_server")

FIELDS = ("src", "tgt", "response")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8731  # PaddleNLP's port
DEFAULT_SCORER = "kk"  # PaddleNLP's reward server scores Knights and Knaves
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BATCH = 8192
DEFAULT_LOG_INTERVAL_S = 60.0
DEFAULT_CONNECTION_LIMIT = 1000  # waitress' own default (100) is starved by 100 idle keep-alive sockets
TOKEN_ENV = "PPO_REWARD_SERVER_TOKEN"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

SUCCESS = 0
ERR_INVALID_JSON = 4001
ERR_MISSING_FIELD = 4002
ERR_BAD_TYPE = 4003
ERR_EMPTY_BATCH = 4004
ERR_LENGTH_MISMATCH = 4005
ERR_BATCH_TOO_LARGE = 4006
ERR_UNAUTHORIZED = 4010
ERR_BODY_TOO_LARGE = 4013
ERR_SCORER_RAISED = 5001
ERR_SCORER_BAD_VALUE = 5002


class RequestError(Exception):
    """A request the server refuses: HTTP status, error code and message."""

    def __init__(self, status, error_code, message):
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


class _Stats:
    """Thread-safe request counters, logged at most every `interval` seconds."""

    def __init__(self, interval_s):
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.requests = self.items = self.client_errors = self.server_errors = 0
        self.last_log = time.monotonic()

    def record(self, items=0, status=200):
        with self.lock:
            self.requests += 1
            self.items += items
            if 400 <= status < 500:
                self.client_errors += 1
            elif status >= 500:
                self.server_errors += 1
            now = time.monotonic()
            if now - self.last_log < self.interval_s:
                return
            self.last_log = now
            line = (
                f"requests={self.requests} items={self.items} "
                f"client_errors={self.client_errors} server_errors={self.server_errors}"
            )
        logger.info("stats %s", line)

    def snapshot(self):
        with self.lock:
            return {
                "requests": self.requests,
                "items": self.items,
                "client_errors": self.client_errors,
                "server_errors": self.server_errors,
            }


def _json_response(payload, status=200):
    return Response(json.dumps(payload, ensure_ascii=False), status=status, mimetype="application/json")


def _error_response(status, error_code, message):
    return _json_response({"error_code": error_code, "error_msg": message}, status)


def parse_request(body, max_batch):
    """Validate a request body (bytes); return the three lists or raise RequestError."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:
        raise RequestError(400, ERR_INVALID_JSON, f"request body is not valid JSON: {err}") from None
    except RecursionError:
        raise RequestError(400, ERR_INVALID_JSON, "request body is nested too deeply to parse") from None
    if not isinstance(data, dict):
        raise RequestError(
            400, ERR_INVALID_JSON, f"request body must be a JSON object with {list(FIELDS)}, got {type(data).__name__}"
        )
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise RequestError(
            400, ERR_MISSING_FIELD, f"missing field(s) {missing}; the body needs lists {list(FIELDS)}"
        )
    for field in FIELDS:
        values = data[field]
        if not isinstance(values, list):
            raise RequestError(
                400, ERR_BAD_TYPE, f"field '{field}' must be a list of strings, got {type(values).__name__}"
            )
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise RequestError(
                    400, ERR_BAD_TYPE, f"field '{field}' item {i} must be a string, got {type(value).__name__}"
                )
    n = len(data["src"])
    for field in FIELDS[1:]:
        if len(data[field]) != n:
            raise RequestError(
                400, ERR_LENGTH_MISMATCH, f"field '{field}' has {len(data[field])} items but 'src' has {n}"
            )
    if n == 0:
        raise RequestError(400, ERR_EMPTY_BATCH, "empty batch: 'src', 'tgt' and 'response' have 0 items")
    if n > max_batch:
        raise RequestError(400, ERR_BATCH_TOO_LARGE, f"batch has {n} items, more than max_batch={max_batch}")
    return data["src"], data["tgt"], data["response"]


def score_batch(scorer, src, tgt, response):
    """Score every item with a `WeightedScorer`; raise RequestError(500) naming the first
    scorer and item that fail. Returns `(totals, per_function)`."""
    try:
        return scorer.score_batch(src, tgt, response)
    except ScorerError as err:
        if not err.bad_value:
            logger.exception("scorer %r raised on item %d", err.scorer_name, err.item)
        raise RequestError(500, ERR_SCORER_BAD_VALUE if err.bad_value else ERR_SCORER_RAISED, str(err)) from None


def checked_request_body(request, token, max_body_bytes):
    """The body bytes of a scoring `request` (Flask's), after the bearer `token` (when set) and
    the size limit; a RequestError (401 / 413) otherwise."""
    if token:
        reason = check_token(request.headers.get("Authorization"), token)
        if reason:
            raise RequestError(401, ERR_UNAUTHORIZED, reason)
    if request.content_length is not None and request.content_length > max_body_bytes:
        raise RequestError(
            413,
            ERR_BODY_TOO_LARGE,
            f"request body has {request.content_length} bytes, more than max_body_bytes={max_body_bytes}",
        )
    return request.get_data(cache=False)  # raises RequestEntityTooLarge past the limit


def create_app(
    scorer_name=DEFAULT_SCORER, max_body_bytes=DEFAULT_MAX_BODY_BYTES, max_batch=DEFAULT_MAX_BATCH,
    log_interval_s=DEFAULT_LOG_INTERVAL_S, weights=None, token=None,
):
    """The Flask app scoring with the scorer(s) registered as `scorer_name` (or `module:function`);
    `scorer_name` may list several, comma-separated, combined with `weights` (see `WeightedScorer`).

    Raises ValueError at once for an unknown scorer or bad weights, so they fail at start-up.
    With `token`, scoring requests must carry `Authorization: Bearer <token>` (401 otherwise).
    """
    if max_body_bytes <= 0 or max_batch <= 0:
        raise ValueError(f"max_body_bytes and max_batch must be positive, got {max_body_bytes}, {max_batch}")
    scorer = WeightedScorer(scorer_name, weights)
    app = Flask("ppo.reward_server")
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    stats = _Stats(log_interval_s)
    app.extensions["reward_stats"] = stats

    @app.errorhandler(HTTPException)
    def _http_error(err):
        if isinstance(err, RequestEntityTooLarge):
            status, code, msg = 413, ERR_BODY_TOO_LARGE, f"request body is larger than max_body_bytes={max_body_bytes}"
        else:
            status, code, msg = err.code or 500, err.code or 500, f"{err.name}: {err.description}"
        logger.warning("rejected %s %s: %s", request.method, request.path, msg)
        stats.record(status=status)
        return _error_response(status, code, msg)

    @app.get("/health")
    def _health():  # never needs a token; says whether the one sent (if any) would be accepted
        payload = {"status": "ok", "scorer": scorer_name, "token_required": bool(token)}
        if token:
            reason = check_token(request.headers.get("Authorization"), token)
            payload["token_accepted"] = reason is None
            if reason:
                payload["token_problem"] = reason
        return _json_response(payload)

    @app.post("/")
    def _score():
        n_items = 0
        try:
            body = checked_request_body(request, token, max_body_bytes)
            src, tgt, response = parse_request(body, max_batch)
            n_items = len(src)
            scores, per_function = score_batch(scorer, src, tgt, response)
        except RequestError as err:
            if err.status < 500:
                logger.warning("rejected request: %s", err.message)
            stats.record(items=n_items, status=err.status)
            return _error_response(err.status, err.error_code, err.message)
        stats.record(items=n_items)
        reply = {"error_code": SUCCESS, "error_msg": "Success", "score": scores}
        if len(per_function) > 1:  # one scorer: exactly PaddleNLP's reply
            reply["scores_per_function"] = per_function
        return _json_response(reply)

    return app
