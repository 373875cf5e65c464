"""Write a model of ours as a Hugging Face safetensors directory (transformers, vLLM, SGLang load it).

    python scripts/export_hf.py --model_path outputs/tiny/ppo/policy --output_dir exported/policy
    python scripts/export_hf.py --model_path outputs/tiny/lora/sft --output_dir exported/sft-merged
    python scripts/export_hf.py --model_path outputs/tiny/rm --output_dir exported/rm --max_shard_size 2GB

`--model_path` is a PaddleNLP model directory written here (SFT/DPO output, PPO `policy/` or
`value/`, a reward or cost model) or a LoRA adapter, merged into its base first. A causal LM
becomes `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM`; a score model (reward, cost, critic)
`LlamaForSequenceClassification` / `Qwen2ForSequenceClassification` with one label, its head
`score.weight` (and `score.bias`), its score type and normaliser statistics in `config.json`.
Weights keep their dtype unless `--dtype` is given; above `--max_shard_size` they are split into
shards with `model.safetensors.index.json`. The rotary settings are written in both
`config.json` layouts (transformers 4's `rope_theta` / `rope_scaling` and 5's
`rope_parameters`) unless `--config_layout` picks one. The tokenizer files are copied (a SentencePiece
vocabulary also as `tokenizer.model`). `paddle_align_export.json` lists what was written: an
output_dir holding another model is refused unless `--overwrite`, an earlier export there is
replaced, and `--model_path` itself is never written into. No torch needed. Names, layouts and what is not
converted: docs/hf_weights.md.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    from ppo.common.argument_help import OneMessageArgumentParser  # noqa: E402
    from ppo.common.argument_problems import joined_problems  # noqa: E402
    from ppo.common.validation import model_dir_problems  # noqa: E402
    from ppo.models.export_target import clear_for_export, export_target_problems, mark_export  # noqa: E402
    from ppo.models.hf_files import parse_size  # noqa: E402
    from ppo.models.hf_format import DTYPES  # noqa: E402
    from ppo.models.hf_rope import LAYOUTS  # noqa: E402


def export_problems(args):
    """Every problem of the export's arguments: no loadable model at model_path, an output_dir
    that is the input (or its LoRA base) or holds another model without --overwrite
    (`ppo.models.export_target`), a shard size that is not a size."""
    problems = model_dir_problems([("model_path", args.model_path)])
    if not problems:
        problems += export_target_problems(args.output_dir, args.model_path, args.overwrite)
    try:
        if parse_size(args.max_shard_size) <= 0:
            raise ValueError
    except ValueError:
        problems.append(f"max_shard_size={args.max_shard_size!r}: expected a size such as 5GB, 500MB or a byte count")
    return problems


def main(argv=None):
    parser = OneMessageArgumentParser(description=__doc__.split("\n")[0])
    path = os.path.expanduser
    parser.add_argument("--model_path", required=True, type=path,
                        help="our model directory (causal LM or score model) or LoRA adapter to export")
    parser.add_argument("--output_dir", required=True, type=path, help="where the Hugging Face directory goes")
    parser.add_argument("--max_shard_size", default="5GB",
                        help="largest safetensors file before the weights are sharded (5GB, 500MB, bytes)")
    parser.add_argument("--dtype", default=None, choices=DTYPES, help="cast the weights (default: keep their dtype)")
    parser.add_argument("--config_layout", default="both", choices=LAYOUTS,
                        help="rotary fields in config.json: transformers4 (rope_theta, rope_scaling), transformers5 "
                             "(rope_parameters) or both (default: every transformers version reads it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a model that output_dir holds (an earlier export of this script is replaced "
                             "without it; model_path itself never)")
    args = parser.parse_args(argv)
    problems = export_problems(args)
    if problems:
        parser.error(joined_problems(problems))
    from ppo.models.hf_convert import export_dir

    config, tokenizer_files = export_dir(args.model_path, args.output_dir, parse_size(args.max_shard_size), args.dtype,
                                         layout=args.config_layout, before_writing=clear_for_export)
    mark_export(args.output_dir, args.model_path, tokenizer_files)
    print(f"exported {args.model_path} as {config['architectures'][0]} ({config['dtype']}) into {args.output_dir}; "
          f"tokenizer files: {', '.join(tokenizer_files) or 'none found'}")


if __name__ == "__main__":
    main()
