"""The parts of `ppo.ppo_trainer.PPOTrainer`, one per phase of a step: making experience
(`experience_maker`), the update (`update`) and the loop around steps (`loop`)."""
