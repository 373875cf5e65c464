"""Answer prompts with a trained policy or LoRA adapter, through the rollout engine that trained it.

    python scripts/chat.py --model outputs/tiny/ppo --prompt "Reverse: a3b9c"       # PPO's policy/
    python scripts/chat.py --model outputs/tiny/sft --greedy --prompt "Reverse: ab1j" --prompt "Reverse: 9cd04"
    python scripts/chat.py --model outputs/tiny/lora/ppo/policy --prompts_file prompts.jsonl --output answers.jsonl
    echo "Reverse: a3b9c" | python scripts/chat.py --model outputs/tiny/dpo          # prompts from stdin

`--model` is what a stage wrote: a model directory in PaddleNLP's layout (`config.json`, weights,
tokenizer), a LoRA adapter (`lora_config.json` naming its base; an adapter on an adapter is merged
in memory), or a run's `output_dir` whose `policy/` is the model (PPO, GRPO, online DPO; also
`checkpoint-<step>`). A score model (reward or cost) is refused: it scores, it does not answer.

Prompt format: as the run trained it when its `resolved_arguments.json` sits in the model
directory or one or two levels above (`use_chat_template`, `prompt_template`); otherwise the
tokenizer's chat template where it has one, else the default text template. `--prompt_template` /
`--use_chat_template` override either. With the chat template, the run's `chat_template` file and
`chat_template_kwargs` apply too (`--chat_template_kwargs '{"enable_thinking": false}'` overrides
the arguments).

Sampling: the training arguments' names (`max_dec_len`, `min_dec_len`, `temperature`, `top_k`,
`top_p`, `repetition_penalty`), each the run's value when its `resolved_arguments.json` has one
(SFT and DPO runs: `max_dec_len` from `eval_max_new_tokens`), else the training default; a flag
overrides it. `--greedy` decodes greedily, as the stages' held-out evaluation does.

Answers go to stdout (`>>> prompt` then the answer); `--output FILE` also writes one JSON object a
line: prompt, prompt_text (as formatted), response, num_tokens.
"""
import argparse
import json
import os
import sys


SAMPLING = ("max_dec_len", "min_dec_len", "temperature", "top_k", "top_p", "repetition_penalty")
PROMPT_KEYS = ("prompt", "src", "input", "query", "question", "instruction")
"""Fields of a JSONL prompts file tried in order when `--prompt_key` is not given."""
RUN_FILE = "resolved_arguments.json"


def json_object(text):
    """A `--chat_template_kwargs` value: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def template_settings(args, run, chat):
    """`(chat_template, chat_template_kwargs)` of the run (its template file and arguments; the
    flag's arguments over the run's), applied only when prompts use the chat template."""
    if not chat:
        if args.chat_template_kwargs:
            raise ValueError("--chat_template_kwargs needs the chat template (use_chat_template false here)")
        return None, {}
    kwargs = args.chat_template_kwargs if args.chat_template_kwargs is not None else run.get("chat_template_kwargs")
    return run.get("chat_template"), dict(kwargs or {})


def parse_args(argv=None):
    """The command line, parsed before Paddle is imported (`--help` and mistakes answer at once)."""
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(description=doc[0], epilog="\n\n".join(doc[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", "--model_name_or_path", dest="model", required=True,
                        help="a model directory, a LoRA adapter, or a run's output_dir holding policy/")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for several)")
    parser.add_argument("--prompts_file", default=None,
                        help="prompts: .jsonl (a string, or an object with --prompt_key, per line) or plain text (one a line)")
    parser.add_argument("--prompt_key", default=None, help=f"the JSONL field holding the prompt (default: first of {PROMPT_KEYS})")
    parser.add_argument("--output", default=None, help="also write the answers here, one JSON object a line")
    parser.add_argument("--prompt_template", default=None, help="a text template with {input} (default: the run's, see above)")
    parser.add_argument("--use_chat_template", choices=("true", "false"), default=None,
                        help="format with the tokenizer's chat template (default: the run's, else where the tokenizer has one)")
    parser.add_argument("--chat_template_kwargs", type=json_object, default=None,
                        help='arguments of the chat template as JSON, e.g. \'{"enable_thinking": false}\' (default: the run\'s)')
    for name, kind in zip(SAMPLING, (int, int, float, int, float, float)):
        parser.add_argument(f"--{name}", type=kind, default=None, help=f"{name} (default: the run's, else the training default)")
    parser.add_argument("--max_new_tokens", type=int, dest="max_dec_len", help="the same as --max_dec_len")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding (first argmax) instead of sampling")
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampling (default: a fresh one each run)")
    parser.add_argument("--batch_size", type=int, default=16, help="prompts generated together (default %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="weights' dtype")
    args = parser.parse_args(argv)
    if args.prompts_file and not os.path.isfile(args.prompts_file):
        parser.error(f"--prompts_file: {args.prompts_file} does not exist")
    if args.batch_size < 1:
        parser.error(f"--batch_size must be at least 1, got {args.batch_size}")
    try:
        args.model = resolve_model_dir(args.model)
    except ValueError as err:
        parser.error(str(err))
    return parser, args


def resolve_model_dir(path):
    """The model or adapter directory of `path`: itself, or its `policy/` when `path` is a run's
    output_dir (or checkpoint) with no model of its own."""
    def is_model(p):
        return any(os.path.isfile(os.path.join(p, f)) for f in ("config.json", "lora_config.json"))

    if not os.path.isdir(path):
        raise ValueError(f"--model: {path} is not a directory")
    if is_model(path):
        return path
    policy = os.path.join(path, "policy")
    if os.path.isdir(policy) and is_model(policy):
        return policy
    raise ValueError(f"--model: {path} holds no model (config.json), LoRA adapter (lora_config.json) or policy/")


def find_run_arguments(model_dir):
    """The `resolved_arguments.json` of the run that wrote `model_dir`: in it, or one or two levels
    up (a PPO run's `policy/`, a checkpoint's `checkpoint-<step>/policy/`); None when there is none."""
    here = os.path.abspath(model_dir)
    for _ in range(3):
        candidate = os.path.join(here, RUN_FILE)
        if os.path.isfile(candidate):
            return candidate
        here = os.path.dirname(here)
    return None


def read_run_arguments(path):
    """Every field of a `resolved_arguments.json` (grouped by argument class) in one flat dict."""
    if path is None:
        return {}
    with open(path) as f:
        groups = json.load(f)
    flat = {}
    for values in groups.values():
        if isinstance(values, dict):
            flat.update(values)
    return flat


def training_defaults():
    """The training defaults of the sampling and prompt-format fields (their dataclasses)."""
    import dataclasses

    from ppo.entry.argument_groups import DatasetArguments, RolloutArguments

    defaults = {f.name: f.default for f in dataclasses.fields(RolloutArguments) if f.name in SAMPLING}
    defaults["prompt_template"] = next(f.default for f in dataclasses.fields(DatasetArguments) if f.name == "prompt_template")
    return defaults


def choose_settings(args, run, defaults, has_chat_template):
    """`(sampling, prompt_template, use_chat_template)`: each setting from the flags, else the run's
    arguments `run`, else `defaults`; the chat template by default only where the tokenizer has one."""
    run = dict(run)
    if run.get("max_dec_len") is None and run.get("eval_max_new_tokens"):
        run["max_dec_len"] = run["eval_max_new_tokens"]  # SFT/DPO: their held-out generation length
    sampling = {}
    for name in SAMPLING:
        given = getattr(args, name)
        sampling[name] = given if given is not None else run[name] if run.get(name) is not None else defaults[name]
    template = args.prompt_template or run.get("prompt_template") or defaults["prompt_template"]
    if args.use_chat_template is not None:
        chat = args.use_chat_template == "true"
    elif args.prompt_template is not None:
        chat = False  # a template on the command line is the one to use
    elif run.get("use_chat_template") is not None:
        chat = bool(run["use_chat_template"])
    else:
        chat = has_chat_template
    return sampling, template, chat


def read_prompts(args, stdin=None):
    """The prompts of `--prompt`, then `--prompts_file`; stdin's lines when neither gives one."""
    prompts = list(args.prompt)
    if args.prompts_file:
        prompts += read_prompts_file(args.prompts_file, args.prompt_key)
    if not prompts and not args.prompts_file:
        stdin = sys.stdin if stdin is None else stdin
        prompts = [line.rstrip("\n") for line in stdin if line.strip()]
    if not prompts:
        raise ValueError("no prompts: pass --prompt, --prompts_file or lines on stdin")
    return prompts


def read_prompts_file(path, key=None):
    """Prompts of a file: `.jsonl` / `.json` lines (a string, or an object's `key` field, by default
    the first of PROMPT_KEYS it has) or plain text, one prompt per non-empty line."""
    with open(path, encoding="utf-8") as f:
        lines = [(number, line.rstrip("\n")) for number, line in enumerate(f, start=1) if line.strip()]
    if not path.endswith((".jsonl", ".json")):
        return [line for _, line in lines]
    prompts = []
    for number, line in lines:
        try:
            value = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{path}: line {number} is not JSON ({err})") from None
        if isinstance(value, dict):
            field = key or next((k for k in PROMPT_KEYS if k in value), None)
            if field is None or field not in value:
                raise ValueError(f"{path}: line {number} has no field {field or list(PROMPT_KEYS)} (set --prompt_key)")
            value = value[field]
        if not isinstance(value, str):
            raise ValueError(f"{path}: line {number}: the prompt is a {type(value).__name__}, not a string")
        prompts.append(value)
    return prompts


def load_policy(model_dir, dtype):
    """`(model, tokenizer)` of a causal-LM directory or adapter, dropout off, in eval mode."""
    from ppo.models.adapters import is_score_adapter, read_config
    from ppo.models.loading import load_causal_lm, load_tokenizer, set_dropout_off

    if is_score_adapter(model_dir) or "score_type" in read_config(model_dir):
        raise ValueError(f"{model_dir} is a score model (reward or cost); chat needs a policy (a causal LM)")
    tokenizer = load_tokenizer(model_dir)
    model = set_dropout_off(load_causal_lm(model_dir, dtype=dtype))
    model.eval()
    return model, tokenizer


def encode_prompts(prompts, tokenizer, template, use_chat_template):
    """`(texts, ids)`: each prompt formatted as the datasets format a final user turn and tokenised
    as they tokenise it (no special tokens added after a chat template)."""
    from ppo.data.collate import format_prompt
    from ppo.data.encode import encode_exact, encode_text

    texts = [format_prompt(p, tokenizer, template=template, use_chat_template=use_chat_template) for p in prompts]
    return texts, [encode_exact(tokenizer, t) if use_chat_template else encode_text(tokenizer, t) for t in texts]


def generate(engine, tokenizer, ids, params, batch_size, seed=None):
    """`(responses, token counts)` for the prompt ids, `batch_size` left-padded prompts at a time."""
    from ppo.data.collate import left_padding
    from ppo.evaluation import decode_responses

    responses, counts = [], []
    for start in range(0, len(ids), batch_size):
        rows = ids[start : start + batch_size]
        input_ids = left_padding(rows, tokenizer.pad_token_id)
        mask = left_padding([[1] * len(r) for r in rows], 0)
        out = engine.generate(input_ids, mask, params, seed=None if seed is None else seed + start)
        responses += decode_responses(tokenizer, out.response_ids, out.response_mask)
        counts += out.response_lengths.numpy().tolist()
    return responses, counts


def describe(model_dir, run_file, sampling, greedy, template, chat):
    from ppo.models.loading import is_lora_dir, lora_base_path

    kind = f"LoRA adapter on {lora_base_path(model_dir)}" if is_lora_dir(model_dir) else "full model"
    fmt = "the tokenizer's chat template" if chat else f"template {template!r}"
    how = "greedy" if greedy else "sampling"
    return (f"[chat] {model_dir} ({kind}); prompts formatted with {fmt}; {how}: "
            + ", ".join(f"{k} {v}" for k, v in sampling.items())
            + (f" (the run's settings from {run_file}, flags over them)" if run_file else " (training defaults, flags over them)"))


def main(argv=None, stdin=None):
    """Answer the prompts; returns the records (prompt, prompt_text, response, num_tokens)."""
    parser, args = parse_args(argv)
    try:
        prompts = read_prompts(args, stdin)
    except ValueError as err:
        parser.error(str(err))
    from ppo.common.cpu_flags import default_mkl_code_path
    default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)
    from ppo.rollout import RolloutEngine, SamplingParams

    run_file = find_run_arguments(args.model)
    try:
        model, tokenizer = load_policy(args.model, args.dtype)
        sampling, template, chat = choose_settings(args, read_run_arguments(run_file), training_defaults(),
                                                   bool(getattr(tokenizer, "chat_template", None)))
        params = SamplingParams(max_new_tokens=sampling["max_dec_len"], min_new_tokens=sampling["min_dec_len"],
                                temperature=sampling["temperature"], top_k=sampling["top_k"], top_p=sampling["top_p"],
                                repetition_penalty=sampling["repetition_penalty"], do_sample=not args.greedy)
        from ppo.data.chat_template_file import apply_chat_template_setting

        apply_chat_template_setting(tokenizer, *template_settings(args, read_run_arguments(run_file), chat))
        texts, ids = encode_prompts(prompts, tokenizer, template, chat)
    except ValueError as err:
        parser.exit(2, f"chat.py: error: {err}\n")
    print(describe(args.model, run_file, sampling, args.greedy, template, chat), file=sys.stderr, flush=True)
    engine = RolloutEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tokenizer=tokenizer)
    responses, counts = generate(engine, tokenizer, ids, params, args.batch_size, args.seed)
    records = [{"prompt": p, "prompt_text": t, "response": r, "num_tokens": int(n)}
               for p, t, r, n in zip(prompts, texts, responses, counts)]
    for record in records:
        print(f">>> {record['prompt']}\n{record['response']}", flush=True)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return records


if __name__ == "__main__":
    main()
