#!/usr/bin/env bash
# One command for a newcomer: set up .venv (first time only), then run the tiny CPU
# pipeline SFT -> RM -> audit -> PPO -> GRPO -> DPO and print the results table.
# Re-running continues from the stages already done; pass --restart to start over, --arch qwen3
# (or qwen3_moe, ernie45, ...) for another model family. Every flag goes to scripts/quickstart.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MKL_DEBUG_CPU_TYPE=5
exec .venv/bin/python scripts/quickstart.py "$@"
