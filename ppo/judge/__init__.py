"""A generative judge: a language model that scores answers by the probability of a verdict token
(``model_judge.GenerativeJudge``: pointwise yes/no or a score, pairwise with both orders averaged),
its rubric templates (``templates``), and the ``judge`` entry of the scorer registry
(``scorer``, registered when this package is imported; ``ppo.scorers`` imports it)."""
from . import scorer  # noqa: F401 (registers the judge scorer)
from .templates import TEMPLATES, render, template_text

__all__ = ["TEMPLATES", "render", "template_text"]
