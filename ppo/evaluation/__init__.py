"""Held-out evaluation: greedy generation with exact-match accuracy (`generation`), n sampled
answers per prompt judged by a verifier (`sampled`) with pass@k, maj@k, mean@k (`metrics`),
PaddleNLP's early-stopping rule (`early_stopping`), and, for PaddleNLP `Trainer` subclasses,
the mixin that runs the generation in the run's layout (`trainer_mixin`, imported from there)."""
from .generation import LONG_ANSWER_LEN, decode_responses, evaluate_generation, exact_match_metrics, reward_model_score_fn

__all__ = ["LONG_ANSWER_LEN", "decode_responses", "evaluate_generation", "exact_match_metrics", "reward_model_score_fn"]
