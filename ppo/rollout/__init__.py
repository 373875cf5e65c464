"""Fast rollout (generation) engine for PPO, GRPO and evaluation.

    from ppo.rollout import RolloutEngine, SamplingParams, RolloutOutput
    engine = RolloutEngine(model, eos_token_id=2, pad_token_id=3)
    out = engine.generate(input_ids, attention_mask, SamplingParams(max_new_tokens=16), seed=0)

See engine.py for the design, params.py for the exact semantics of every setting and output,
ops.py for the op set it runs, and ppo/kernels/ for the compiled library
(`python csrc/build_ops.py`).
"""
from .engine import RolloutEngine
from .ops import get_ops
from .params import RolloutOutput, SamplingParams

__all__ = ["RolloutEngine", "SamplingParams", "RolloutOutput", "get_ops"]
