"""Convert a Hugging Face safetensors directory (Llama, Qwen2, Qwen3) into our PaddleNLP layout.

    python scripts/import_hf.py --hf_path ~/models/Qwen2.5-0.5B-Instruct --output_dir models/qwen2.5-0.5b
    python scripts/import_hf.py --hf_path ~/models/my-reward-model --output_dir models/rm --dtype float32

Most runs need no conversion: `model_name_or_path` (and the PPO model paths) may name a Hugging
Face directory, converted in memory at load. Convert once for tensor or pipeline parallelism
(PaddleNLP's loaders split a PaddleNLP checkpoint), or to keep a PaddleNLP copy.
`LlamaForCausalLM` / `Qwen2ForCausalLM` become PaddleNLP causal LMs (`Qwen3ForCausalLM` our own class); a one-label
`*ForSequenceClassification` (a TRL reward or value model, or one written by
scripts/export_hf.py) becomes our score model, with the score type and normaliser statistics
of its `config.json` when it has them. Weights keep their dtype unless `--dtype` is given.
The tokenizer files are copied (a SentencePiece `tokenizer.model` also as
`sentencepiece.bpe.model`, the name PaddleNLP's `LlamaTokenizer` reads). No torch needed.
"""
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.common.quiet_start import quiet_third_party_warnings  # noqa: E402

with quiet_third_party_warnings():
    from ppo.common.argument_help import OneMessageArgumentParser  # noqa: E402
    from ppo.common.argument_problems import joined_problems  # noqa: E402
    from ppo.common.validation import model_dir_problems, output_dir_problems  # noqa: E402
    from ppo.models.hf_checks import hf_model_problems  # noqa: E402
    from ppo.models.hf_convert import is_hf_dir  # noqa: E402
    from ppo.models.hf_format import DTYPES  # noqa: E402


def import_problems(args):
    """Every problem of the import's arguments, before any model is built: hf_path's files (a
    config.json that cannot be read, weights missing or cut short), no Hugging Face directory
    there, an architecture or config the import does not build, tensors missing, unexpected or of
    another shape (`ppo.common.validation.check_model_dir`, `ppo.models.hf_checks`); an output_dir
    that is the input."""
    problems = model_dir_problems([("hf_path", args.hf_path)])  # config.json readable, weights not cut short
    if not problems and not is_hf_dir(args.hf_path):
        problems.append(f"hf_path={args.hf_path}: no Hugging Face model directory (config.json and safetensors "
                        "written by transformers, header format 'pt')")
    if not problems:
        problems = hf_model_problems("hf_path", args.hf_path)
    return problems + output_dir_problems(args.output_dir, [("hf_path", args.hf_path)])


def main(argv=None):
    parser = OneMessageArgumentParser(description=__doc__.split("\n")[0])
    path = os.path.expanduser
    parser.add_argument("--hf_path", required=True, type=path, help="Hugging Face model directory (safetensors)")
    parser.add_argument("--output_dir", required=True, type=path, help="where the PaddleNLP model directory goes")
    parser.add_argument("--dtype", default=None, choices=DTYPES, help="cast the weights (default: keep their dtype)")
    parser.add_argument("--safe_serialization", action="store_true",
                        help="save model.safetensors (PaddleNLP's layout) instead of model_state.pdparams")
    args = parser.parse_args(argv)
    problems = import_problems(args)
    if problems:
        parser.error(joined_problems(problems))
    from ppo.models.hf_import import import_dir
    from ppo.models.loading import load_tokenizer

    model, tokenizer_files = import_dir(args.hf_path, args.output_dir, args.dtype, args.safe_serialization)
    print(f"imported {args.hf_path} as {type(model).__name__} into {args.output_dir}; "
          f"tokenizer files: {', '.join(tokenizer_files) or 'none found'}")
    try:
        load_tokenizer(args.output_dir)
    except Exception as err:  # the weights are written; say what the tokenizer lacks
        print(f"warning: PaddleNLP cannot load the copied tokenizer ({type(err).__name__}: {err}); PaddleNLP 3.0.0b4 "
              "reads vocab.json + merges.txt (Qwen2Tokenizer) or a SentencePiece model (LlamaTokenizer), not a "
              "tokenizer.json alone")


if __name__ == "__main__":
    main()
