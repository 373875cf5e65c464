"""Serve an environment over HTTP for `env_name remote`: `python ppo/env_server.py --env_name NAME`
(or `paddle-align env-server ...`); the server is ppo/agents/env_server.py, its client
ppo/agents/remote_env.py."""
import os
import sys

if __package__ in (None, ""):  # run as a script: the repository root on the path, as `python -m` would
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ppo.agents.env_server import main  # noqa: E402

if __name__ == "__main__":
    main()
