"""PaddleNLP's RL entry point under its own name (run_rl.py): the PPO entry reading `rl_algorithm`."""
