"""PaddleNLP's RL entry point under its own name (`llm/alignment/rl/run_rl.py`): PPO, GRPO,
REINFORCE++ and VAPO from PaddleNLP's `rl/` YAML (or JSON) argument files, unchanged.

    python -m paddle.distributed.launch rl/run_rl.py config/qwen/grpo_argument.yaml [--flag value ...]
    cd rl && python -m paddle.distributed.launch run_rl.py ../tests/fixtures/paddlenlp/qwen/vapo_argument.yaml

The same start-up, models and trainer as `ppo/run_ppo.py` (`ppo.run_ppo.build_trainer`), with
PaddleNLP's argument handling: `rl_algorithm` (ppo | grpo | reinforce_plus_plus | rloo | vapo)
picks the advantage estimator (`ppo/common/paddlenlp_keys.py`, docs/paddlenlp.md), its older
key names (`mini_batch_size`, `per_device_rollout_batch_size`, `quant_type`, `label_key`) are
read as the current ones, and every other key acts as in PaddleNLP or is refused saying why.
As PaddleNLP's, a run resumes from the newest checkpoint in `output_dir` unless
`overwrite_output_dir` is set.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("rl")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from ppo.common.process_exit import run_and_exit  # noqa: E402
from ppo.run_ppo import build_trainer, main  # noqa: E402,F401  (build_trainer: for tests and embedding)

if __name__ == "__main__":
    run_and_exit(main)
