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

The app is ``ppo/serving/reward_app.py``. Scorers are pure functions (``ppo/scorers/``), so requests are scored in
parallel by waitress's worker threads without a lock. Request, item and error
counts are logged every ``--log_interval`` seconds (on the next request), and
every rejected request is logged with its reason. ``--connection_limit`` caps the
open sockets (waitress refuses more; idle keep-alive sockets count too), and a
bind beyond loopback is logged as a warning. This module does not import paddle.
"""

import argparse
import json
import logging
import os
import signal

from ppo.common.argument_help import OneMessageArgumentParser
from ppo.serving.reward_app import (  # noqa: F401 (the app's names, importable from here as before)
    DEFAULT_CONNECTION_LIMIT, DEFAULT_HOST, DEFAULT_LOG_INTERVAL_S, DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PORT, DEFAULT_SCORER, ERR_BAD_TYPE, ERR_BATCH_TOO_LARGE, ERR_BODY_TOO_LARGE, ERR_EMPTY_BATCH,
    ERR_INVALID_JSON, ERR_LENGTH_MISMATCH, ERR_MISSING_FIELD, ERR_SCORER_BAD_VALUE, ERR_SCORER_RAISED,
    ERR_UNAUTHORIZED, FIELDS, LOOPBACK_HOSTS, SUCCESS, TOKEN_ENV, RequestError, check_token, create_app, parse_request,
    score_batch,
)

logger = logging.getLogger("ppo.reward_server")


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
