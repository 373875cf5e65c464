"""HTTP reward server for GRPO/PPO with rule-based rewards (PaddleNLP's contract).

Run (from the repository root, or from inside ``ppo/`` as PaddleNLP users do)::

    python ppo/reward_server.py --host 127.0.0.1 --port 8731 --scorer kk --threads 8
    cd ppo && python reward_server.py --scorer reverse
    python ppo/reward_server.py --scorer my_rewards:my_score   # your own function
    python ppo/reward_server.py --scorer kk,math --weights 1,0.5   # weighted sum of several
    python ppo/reward_server.py --scorer '{"gsm8k": 1.0, "format": 0.2}'   # verifiers, as a JSON object

Contract (PaddleNLP ``llm/alignment/ppo/reward_server.py``; its trainer posts to
the URL and reads ``score``):

- ``POST /`` with JSON ``{"src": [str], "tgt": [str], "response": [str]}``
  -> 200 ``{"error_code": 0, "error_msg": "Success", "score": [float],
  "scores_per_function": {name: [float]}}``, one score per item, in order;
  ``score`` is the weighted total (``--weights``, 1 each by default) and
  ``scores_per_function`` (only with several scorers) each scorer's raw scores.
- ``GET /health`` -> 200 ``{"status": "ok", "scorer": NAME, "token_required": bool}`` (never needs a
  token); with a token required it adds ``token_accepted`` for the request's own header (and
  ``token_problem`` when refused), so a client finds a wrong token at start.
- With ``--token`` (or the ``PPO_REWARD_SERVER_TOKEN`` environment variable) set,
  ``POST /`` needs the header ``Authorization: Bearer <token>``; without it the
  answer is HTTP 401, ``error_code`` 4010.

Errors never carry made-up scores (PaddleNLP answers zeros; here there is no
``score`` field at all):

- HTTP 400, ``error_code`` 4001-4006: body not JSON (nested too deeply to parse
  included) / not an object, a field
  missing, a field not a list of strings, an empty batch, lists of different
  lengths, more items than ``--max_batch``; ``error_msg`` names the field.
- HTTP 413, ``error_code`` 4013: body larger than ``--max_body_bytes``.
- HTTP 500, ``error_code`` 5001: the scorer raised on an item; 5002: it returned
  something that is not a finite number. ``error_msg`` names the item index.
- Other HTTP errors (404, 405) answer JSON with ``error_code`` = the status.

Scorers are pure functions (``ppo/scorers.py``), so requests are scored in
parallel by waitress's worker threads without a lock. Request, item and error
counts are logged every ``--log_interval`` seconds (on the next request), and
every rejected request is logged with its reason. ``--connection_limit`` caps the
open sockets (waitress refuses more; idle keep-alive sockets count too), and a
bind beyond loopback is logged as a warning. This module does not import paddle.
"""
import argparse
import hmac
import json
import logging
import os
import signal
import threading
import time

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from ppo.common.argument_help import OneMessageArgumentParser
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


def check_token(header, token):
    """None when `header` (an Authorization value) carries `token`, else the reason it does not."""
    if not header:
        return "missing 'Authorization: Bearer <token>' header; this server requires a token"
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return "the Authorization header must be 'Bearer <token>'"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return "wrong bearer token"
    return None


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


def parse_args(argv=None):
    parser = OneMessageArgumentParser(
        description="Rule-based HTTP reward server (PaddleNLP contract).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to bind (0.0.0.0 for all interfaces)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind")
    parser.add_argument(
        "--scorer",
        default=DEFAULT_SCORER,
        help="registered scorer name (kk, math, reverse, math_boxed, gsm8k, ...; docs/verifiers.md) or "
        "'module.path:function'; several, comma-separated, are summed with --weights; or a JSON object "
        "name -> weight or {\"weight\": w, option: value}",
    )
    parser.add_argument(
        "--weights", default=None, help="comma-separated weight per --scorer (default 1 each), e.g. 1,0.5"
    )
    parser.add_argument("--threads", type=int, default=8, help="waitress worker threads")
    parser.add_argument("--max_body_bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="largest request body")
    parser.add_argument("--max_batch", type=int, default=DEFAULT_MAX_BATCH, help="most items in one request")
    parser.add_argument(
        "--log_interval", type=float, default=DEFAULT_LOG_INTERVAL_S, help="seconds between request-count logs"
    )
    parser.add_argument("--log_file", default=None, help="also write the log to this file")
    parser.add_argument(
        "--connection_limit",
        type=int,
        default=DEFAULT_CONNECTION_LIMIT,
        help="most open sockets (idle keep-alive ones included); waitress refuses connections beyond it",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"require 'Authorization: Bearer TOKEN' on scoring requests (default: ${TOKEN_ENV} if set; "
        "prefer the variable, a flag shows in the process list)",
    )
    return parser.parse_args(argv)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    args = parse_args(argv)
    handlers = [logging.StreamHandler()]
    if args.log_file:
        handlers.append(logging.FileHandler(args.log_file))
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format, handlers=handlers)
    # `kill`/`terminate()` stop the server cleanly, with the final counts logged.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)

    import waitress  # imported here: create_app() users (tests, WSGI hosts) do not need it

    if args.connection_limit <= 0 or args.threads <= 0:
        raise SystemExit(f"--connection_limit and --threads must be positive, got {args.connection_limit}, {args.threads}")
    token = args.token or os.environ.get(TOKEN_ENV) or None
    app = create_app(
        args.scorer, args.max_body_bytes, args.max_batch, args.log_interval, weights=args.weights, token=token
    )
    # waitress itself refuses bodies far over the limit before buffering them all;
    # the app answers JSON 413 for anything over max_body_bytes.
    server = waitress.create_server(
        app,
        host=args.host,
        port=args.port,
        threads=args.threads,
        max_request_body_size=2 * args.max_body_bytes + 65536,
        connection_limit=args.connection_limit,
        ident="ppo-reward-server",
    )
    if args.host not in LOOPBACK_HOSTS:
        logger.warning(
            "bound to %s: the reward server is reachable from other machines%s",
            args.host,
            "" if token else f"; anyone who can reach it may score (set ${TOKEN_ENV} or --token to require a token)",
        )
    logger.info(
        "reward server: scorer=%s weights=%s on http://%s:%s threads=%d max_batch=%d max_body_bytes=%d "
        "connection_limit=%d token=%s",
        args.scorer,
        args.weights or "1 each",
        args.host,
        server.effective_port,
        args.threads,
        args.max_batch,
        args.max_body_bytes,
        args.connection_limit,
        "required" if token else "off",
    )
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        stats = app.extensions["reward_stats"].snapshot()
        logger.info("reward server stopped: %s", json.dumps(stats))
        server.close()


if __name__ == "__main__":
    main()
