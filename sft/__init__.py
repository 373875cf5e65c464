"""Supervised fine-tuning: the entry point (run_sft.py), its arguments and trainer."""
