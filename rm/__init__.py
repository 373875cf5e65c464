"""Reward and cost models: the entry points (run_reward.py, audit_reward.py, audit_cost.py), their arguments and trainers."""
