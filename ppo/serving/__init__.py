"""Serving over HTTP: the reward server's app (`reward_app`, run by `ppo/reward_server.py`) and
the trainer's client of it (`reward_client`)."""
