"""Merge a LoRA adapter (causal LM or score model) into its base model and save a full model directory.

    python sft/merge_lora.py --lora_path outputs/tiny/sft-lora --output_dir outputs/tiny/sft-merged
    python sft/merge_lora.py --lora_path outputs/tiny/lora/rm --output_dir outputs/tiny/rm-merged

The base model is read from the adapter's `lora_config.json`
(`base_model_name_or_path`) unless `--base_model_name_or_path` is given (causal-LM
adapters only); a base that is itself an adapter (a reward adapter trained on an SFT
adapter) is merged first. A causal-LM adapter gives a directory that
`AutoModelForCausalLM.from_pretrained(output_dir)` loads; a score-model adapter
(rm/run_reward.py with `use_lora`) one that `AutoModelForScore.from_pretrained(output_dir)`
loads, with its score head and normaliser statistics.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.argument_help import OneMessageArgumentParser, doc_summary  # noqa: E402
from ppo.common.argument_problems import joined_problems  # noqa: E402
from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402
from ppo.common.validation import is_lora_dir, output_dir_problems  # noqa: E402


def merge_problems(args):
    """Every problem of the merge's arguments: no adapter at lora_path, an output_dir that is an input."""
    problems = []
    if not is_lora_dir(args.lora_path):
        problems.append(f"lora_path={args.lora_path}: no lora_config.json; is this a LoRA adapter directory?")
    inputs = [("lora_path", args.lora_path), ("base_model_name_or_path", args.base_model_name_or_path)]
    return problems + output_dir_problems(args.output_dir, inputs)


def main(argv=None):
    parser = OneMessageArgumentParser(description=doc_summary(__doc__))
    path = os.path.expanduser
    parser.add_argument("--lora_path", required=True, type=path, help="directory written by a use_lora run (holds lora_config.json)")
    parser.add_argument("--output_dir", required=True, type=path, help="where the merged model and tokenizer go")
    parser.add_argument("--base_model_name_or_path", default=None, type=path, help="override the base model recorded in the adapter")
    args = parser.parse_args(argv)
    problems = merge_problems(args)
    if problems:
        parser.error(joined_problems(problems))
    with quiet_third_party_warnings():  # after the arguments: --help and their errors without Paddle
        from ppo.models.loading import merge_lora_to_dir
    merge_lora_to_dir(args.lora_path, args.output_dir, args.base_model_name_or_path)
    print(f"merged {args.lora_path} into {args.output_dir}")


if __name__ == "__main__":
    main()
