"""KTO from PaddleNLP's `kto_argument.json` (PaddleNLP's `llm/alignment/kto/run_kto.py`).

    python -m paddle.distributed.launch dpo/run_kto.py kto_argument.json [--flag value ...]

`dpo/run_dpo.py` with `loss_type` defaulting to `kto` (PaddleNLP's KTO files name no
loss type): every pair gives one desirable and one undesirable example; see
`dpo/dpo_trainer.py`. Arguments, outputs and data are those of `dpo/run_dpo.py`.
"""


from dataclasses import dataclass, field  # noqa: E402

from ppo.common.argument_table import check_early  # noqa: E402

if __name__ == "__main__":
    check_early("kto")  # --help and the argument file's own errors, before Paddle and PaddleNLP load

from dpo.dpo_arguments import DPOTrainingArguments  # noqa: E402
from dpo.run_dpo import main as run_dpo_main  # noqa: E402
from ppo.common.process_exit import run_and_exit  # noqa: E402


@dataclass
class KTOTrainingArguments(DPOTrainingArguments):
    loss_type: str = field(default="kto", metadata={"help": "Preference loss; kto here (any run_dpo.py loss_type is accepted)."})


def main(argv=None):
    return run_dpo_main(argv, training_arguments=KTOTrainingArguments)


if __name__ == "__main__":
    run_and_exit(main)
