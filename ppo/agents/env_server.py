"""``paddle-align env-server``: any environment of the registry served over HTTP.

    paddle-align env-server --env_name tools --env_kwargs '{"tools": ["python"]}' --port 8741
    paddle-align env-server --env_name my_envs:SandboxEnv --host 0.0.0.0 --threads 16   # + $PPO_ENV_SERVER_TOKEN

The trainer then uses ``env_name remote`` with ``env_kwargs {"url": "http://HOST:8741"}``
(ppo/agents/remote_env.py, which states the routes). Each session is one instance of the
served class (built with the server's ``--env_kwargs``, or the session's own ``env_kwargs``),
its ``step`` run one at a time. Steps are numbered by the client: a step whose number was
already answered (a retry after a lost reply) gets the same reply again, the environment not
stepped twice; a new session under a taken id gets the first reply again. ``--max_sessions``
caps the open sessions (HTTP 503 beyond, which the client retries with backoff);
``--session_ttl_s`` closes sessions idle that long (a trainer that died without closing).
Flask app served by waitress, as ppo/reward_server.py; the bearer token as there.
"""
import argparse
import json
import logging
import os
import signal
import threading
import time

from flask import Flask, Response, request

from ppo.common.bearer import check_token

logger = logging.getLogger("ppo.env_server")
DEFAULT_PORT = 8741


class ServeError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class _Session:
    def __init__(self, env, first):
        self.env, self.first, self.lock = env, first, threading.Lock()
        self.seq, self.last_reply, self.touched = 0, None, time.monotonic()


class SessionTable:
    """The open sessions of one served environment (thread-safe) and the counts `/health` shows."""

    def __init__(self, env_name, env_kwargs, max_sessions, session_ttl_s):
        self.env_name, self.env_kwargs = env_name, dict(env_kwargs or {})
        self.max_sessions, self.ttl = int(max_sessions), float(session_ttl_s)
        self.sessions, self.lock = {}, threading.Lock()
        self.counts = {"opened": 0, "closed": 0, "expired": 0, "steps": 0, "step_replays": 0, "errors": 0}

    def snapshot(self):
        with self.lock:
            return {**self.counts, "open": len(self.sessions)}

    def _count(self, name):
        with self.lock:
            self.counts[name] += 1

    def _expire(self):
        now = time.monotonic()
        with self.lock:
            old = [k for k, s in self.sessions.items() if self.ttl > 0 and now - s.touched > self.ttl]
            stale = [self.sessions.pop(k) for k in old]
            self.counts["expired"] += len(stale)
        for s in stale:
            _close_env(s.env)

    def open(self, session_id, record, env_kwargs):
        from .environment import make_environment

        self._expire()
        with self.lock:
            existing = self.sessions.get(session_id)
            if existing is None and len(self.sessions) >= self.max_sessions:
                raise ServeError(503, f"session limit reached ({self.max_sessions} open, --max_sessions)")
        if existing is not None:
            return existing.first
        options = self.env_kwargs if env_kwargs is None else env_kwargs
        try:
            env = make_environment(self.env_name, options)
            first = env.reset(record)
        except Exception as err:  # noqa: BLE001 - the served environment's failure goes back to the client
            self._count("errors")
            raise ServeError(500, f"environment {self.env_name!r} failed to reset: {type(err).__name__}: {err}") from None
        with self.lock:
            self.sessions[session_id] = _Session(env, first)
            self.counts["opened"] += 1
        return first

    def step(self, session_id, action, seq):
        with self.lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise ServeError(404, f"no open session {session_id!r} (closed, expired or never opened)")
        with session.lock:
            session.touched = time.monotonic()
            if seq == session.seq and session.last_reply is not None:
                self._count("step_replays")
                return session.last_reply
            if seq != session.seq + 1:
                raise ServeError(409, f"session {session_id!r}: step {seq} after step {session.seq}")
            try:
                observation, reward, done, info = session.env.step(action)
            except Exception as err:  # noqa: BLE001 - reported to the client as the environment's error
                self._count("errors")
                raise ServeError(500, f"environment {self.env_name!r} step failed: {type(err).__name__}: {err}") from None
            reply = {"observation": observation, "reward": float(reward), "done": bool(done), "info": dict(info or {})}
            session.seq, session.last_reply = seq, json.loads(json.dumps(reply, default=str))
        self._count("steps")
        return session.last_reply

    def close(self, session_id):
        with self.lock:
            session = self.sessions.pop(session_id, None)
            if session is not None:
                self.counts["closed"] += 1
        if session is not None:
            _close_env(session.env)
        return session is not None

    def close_all(self):
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for s in sessions:
            _close_env(s.env)


def _close_env(env):
    close = getattr(env, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - a failing close must not take the server down
            logger.exception("closing an environment failed")


def _json(payload, status=200):
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def served_facts(env_name, env_kwargs):
    """What `/health` tells clients of `env_name`: its tools, stop strings and observation role
    (one instance built and closed); ValueError when it cannot be built."""
    from .environment import environment_facts, environment_problems, make_environment

    problems = environment_problems(env_name, env_kwargs, construct=False)
    if problems:
        raise ValueError("; ".join(problems))
    env = make_environment(env_name, env_kwargs)
    try:
        return {"env_name": env_name, "tools": list(getattr(env, "tools", None) or []),
                "stop_strings": list(getattr(env, "stop_strings", None) or []),
                "observation_role": environment_facts(env_name).observation_role}
    finally:
        _close_env(env)


def _body():
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise ServeError(400, "the request body must be a JSON object")
    return data


def create_app(env_name, env_kwargs=None, token=None, max_sessions=1024, session_ttl_s=3600.0):
    """The Flask app serving `env_name` (built with `env_kwargs`); with `token`, every route but
    `/health` needs `Authorization: Bearer <token>`. ValueError at once when the environment
    cannot be built. `app.extensions["env_sessions"]` is the `SessionTable`."""
    facts = served_facts(env_name, env_kwargs)
    table = SessionTable(env_name, env_kwargs, max_sessions, session_ttl_s)
    app = Flask("ppo.env_server")
    app.extensions["env_sessions"] = table

    def guarded(handler):
        def run(**kwargs):
            try:
                if token:
                    reason = check_token(request.headers.get("Authorization"), token)
                    if reason:
                        raise ServeError(401, reason)
                return _json(handler(**kwargs))
            except ServeError as err:
                logger.warning("%s %s: HTTP %d: %s", request.method, request.path, err.status, err.message)
                return _json({"error_msg": err.message}, err.status)
        run.__name__ = handler.__name__
        return run

    @app.get("/health")
    def _health():
        payload = {"status": "ok", **facts, "token_required": bool(token), "sessions": table.snapshot()}
        if token:
            reason = check_token(request.headers.get("Authorization"), token)
            payload["token_accepted"] = reason is None
            if reason:
                payload["token_problem"] = reason
        return _json(payload)

    @app.post("/sessions")
    @guarded
    def _open():
        data = _body()
        session, record, options = data.get("session"), data.get("record"), data.get("env_kwargs")
        if not isinstance(session, str) or not session or not isinstance(record, dict):
            raise ServeError(400, "POST /sessions needs 'session' (a string) and 'record' (an object)")
        if options is not None and not isinstance(options, dict):
            raise ServeError(400, "'env_kwargs' must be an object")
        return {"session": session, "observation": table.open(session, record, options)}

    @app.post("/sessions/<session>/step")
    @guarded
    def _step(session):
        data = _body()
        if not isinstance(data.get("action"), str) or not isinstance(data.get("seq"), int):
            raise ServeError(400, "a step needs 'action' (a string) and 'seq' (an integer)")
        return table.step(session, data["action"], data["seq"])

    @app.delete("/sessions/<session>")
    @guarded
    def _close(session):
        return {"closed": table.close(session)}

    return app


def parse_args(argv=None):
    from ..common.argument_help import OneMessageArgumentParser

    parser = OneMessageArgumentParser(description="Serve an environment over HTTP for env_name remote (ppo/agents/remote_env.py).",
                                      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env_name", required=True, help="registered environment name or module.path:Class")
    parser.add_argument("--env_kwargs", default="{}", help="JSON object of the environment's constructor arguments")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for all interfaces)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind (0: any free port, logged)")
    parser.add_argument("--threads", type=int, default=16, help="waitress worker threads (steps run in them)")
    parser.add_argument("--max_sessions", type=int, default=1024, help="most open sessions; HTTP 503 beyond")
    parser.add_argument("--session_ttl_s", type=float, default=3600.0, help="close sessions idle this long (0: never)")
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (default: $PPO_ENV_SERVER_TOKEN "
                        "if set; prefer the variable, a flag shows in the process list)")
    return parser.parse_args(argv)


def _options(text):
    try:
        options = json.loads(text or "{}")
    except ValueError as err:
        raise SystemExit(f"env-server: error: --env_kwargs is not JSON: {err}") from None
    if not isinstance(options, dict):
        raise SystemExit(f"env-server: error: --env_kwargs must be a JSON object, got {text!r}")
    return options


def _stop(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _stop)  # `kill` stops the server cleanly, its sessions closed
    if args.threads <= 0 or args.max_sessions <= 0:
        raise SystemExit(f"env-server: error: --threads and --max_sessions must be positive, got {args.threads}, "
                         f"{args.max_sessions}")
    from .remote_env import TOKEN_ENV
    import waitress

    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        app = create_app(args.env_name, _options(args.env_kwargs), token, args.max_sessions, args.session_ttl_s)
    except ValueError as err:
        raise SystemExit(f"env-server: error: {err}") from None
    server = waitress.create_server(app, host=args.host, port=args.port, threads=args.threads, ident="ppo-env-server")
    logger.info("environment server: env_name=%s on http://%s:%s threads=%d max_sessions=%d token=%s", args.env_name,
                args.host, server.effective_port, args.threads, args.max_sessions, "required" if token else "off")
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        table = app.extensions["env_sessions"]
        table.close_all()
        logger.info("environment server stopped: %s", json.dumps(table.snapshot()))
        server.close()
