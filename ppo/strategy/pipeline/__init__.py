"""The pipeline layout (fleet pipelines, optionally with tensor parallel and data parallel):
its strategy (`PipelineStrategy`), its model passes (`passes`), its model pieces (`pipe`: the
shared pipe pieces and SFT's pipe; `policy_pipe`, `score_pipe`, `preference_pipe`) and the PPO
models loaded as pipes (`models`)."""
from .strategy import PipelineStrategy

__all__ = ["PipelineStrategy"]
