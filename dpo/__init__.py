"""The DPO family and online DPO: the entry points (run_dpo.py, run_kto.py, run_online_dpo.py), their arguments, trainer and learner."""
