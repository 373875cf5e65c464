"""TRL side of bench/step_bench.py: one GRPO or PPO run in TRL on the tiny Llama (Qwen3,
Qwen3-MoE) shape, in an environment with torch + transformers + trl (requirements-bench.txt),
never with Paddle.

    python bench/trl_step_worker.py --case grpo --model_dir DIR --prompts FILE --steps 5

The shape comes from DIR/config.json (written by ppo.tiny.factory); weights are transformers'
own random initialisation. The tokenizer is a character-level `PreTrainedTokenizerFast` over
the tiny tokenizer's symbols (same vocabulary size as the model), so prompts have about the
lengths they have in this toolkit. The reward model (and PPO's critic) is the family's
`...ForSequenceClassification` of the same shape. Step time: wall time from one `on_step_end`
callback to the next (everything one optimisation step does, generation included; with
`--interleave`, less the wait between steps while the parent runs one of its own); the first
step is the warm-up and is dropped. One JSON line on stdout, last.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
TEMPLATE_WORDS = ["USER:", "ASSISTANT:", "Reverse:"]


def char_tokenizer(vocab_size):
    """Character-level fast tokenizer with the tiny tokenizer's specials, `vocab_size` ids."""
    import string

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = string.ascii_lowercase + string.digits + string.ascii_uppercase + ".,:;!?()[]{}<>/+-*=_'\"#@%&|~^$ "
    tokens = SPECIALS + TEMPLATE_WORDS + list(symbols)
    tokens += [f"<extra_{i}>" for i in range(max(0, vocab_size - len(tokens)))]
    vocab = {t: i for i, t in enumerate(tokens[:vocab_size])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    pattern = "|".join([w.replace(":", ":") for w in TEMPLATE_WORDS] + ["."])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", padding_side="left")
    fast.chat_template = None
    return fast


def hf_config(model_dir):
    """transformers' config of DIR/config.json's family (llama, qwen3, qwen3_moe), one score label."""
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    common = dict(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
        max_position_embeddings=c.get("max_position_embeddings", 128), rms_norm_eps=c.get("rms_norm_eps", 1e-6),
        bos_token_id=1, eos_token_id=2, pad_token_id=3, num_labels=1,
    )
    if c["model_type"] == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False)
    family = dict(head_dim=c["head_dim"], rope_theta=c["rope_theta"], tie_word_embeddings=c["tie_word_embeddings"])
    if c["model_type"] == "qwen3":
        return Qwen3Config(**common, **family)
    moe = {k: c[k] for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "mlp_only_layers",
                             "decoder_sparse_step", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef")}
    return Qwen3MoeConfig(**common, **family, **moe)


def family_models(config):
    """(causal LM, sequence classifier) of `config`'s family, transformers' random initialisation."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForCausalLM.from_config(config), AutoModelForSequenceClassification.from_config(config)


def read_prompts(path, template="USER: {input} ASSISTANT:"):
    with open(path) as f:
        return [template.format(input=json.loads(line)["src"]) for line in f if line.strip()]


STEP_SIGNAL = "@@step"
"""With `--interleave`, the line the worker prints after each step before it waits for a line on stdin."""


class StepTimer:
    """A `TrainerCallback` timing each step: from the previous `on_step_end` (or `on_train_begin`)
    to this one. With `interleave`, each `on_step_end` prints `STEP_SIGNAL` and waits for a line
    on stdin (the parent runs one of its own steps meanwhile); the next step's clock starts after it."""

    def __new__(cls, interleave=False):
        from transformers import TrainerCallback

        class _Timer(TrainerCallback):
            def __init__(self):
                self.starts, self.ends = [], []

            def on_train_begin(self, args, state, control, **kwargs):
                self.starts.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kwargs):
                self.ends.append(time.perf_counter())
                if interleave:
                    print(STEP_SIGNAL, flush=True)
                    sys.stdin.readline()
                self.starts.append(time.perf_counter())

            @property
            def intervals(self):
                return [end - start for start, end in zip(self.starts, self.ends)]

        return _Timer()


def run_grpo(model_dir, prompts, steps, new_tokens, cfg, out, interleave=False):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = hf_config(model_dir)
    tokenizer = char_tokenizer(config.vocab_size)
    torch.manual_seed(0)
    model_path, reward_path = os.path.join(out, "policy"), os.path.join(out, "reward")
    policy, reward = family_models(config)
    policy.save_pretrained(model_path)  # TRL builds its reference model from the path
    reward.save_pretrained(reward_path)
    rows = cfg["prompts"] * cfg["samples"]
    args = GRPOConfig(
        output_dir=out, per_device_train_batch_size=rows, num_generations=cfg["samples"], max_completion_length=new_tokens,
        beta=cfg["kl_loss_coeff"], num_iterations=cfg["epochs"], max_steps=steps + 1, gradient_accumulation_steps=1,
        learning_rate=1e-5, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, fp16=False,
        temperature=1.0, top_p=1.0, seed=42, dataloader_num_workers=0, disable_tqdm=True,
        generation_kwargs={"min_new_tokens": new_tokens},  # every response full length, as in the toolkit's bench
    )
    timer = StepTimer(interleave)
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward_path, args=args, train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=tokenizer, reward_processing_classes=tokenizer, callbacks=[timer])
    trainer.train()
    return timer.intervals


def run_ppo(model_dir, prompts, steps, new_tokens, cfg, out, interleave=False):
    import torch
    from datasets import Dataset

    try:
        from trl import PPOConfig, PPOTrainer
    except ImportError:
        from trl.experimental.ppo import PPOConfig, PPOTrainer

    config = hf_config(model_dir)
    tokenizer = char_tokenizer(config.vocab_size)
    torch.manual_seed(0)
    (policy, reward), (ref, value) = family_models(config), family_models(config)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    n = cfg["prompts"]
    args = PPOConfig(
        output_dir=out, per_device_train_batch_size=n, gradient_accumulation_steps=1, num_mini_batches=1,
        num_ppo_epochs=cfg["epochs"], response_length=new_tokens, kl_coef=cfg["kl_coeff"], kl_estimator="k1",
        total_episodes=n * (steps + 1), learning_rate=1e-5, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, bf16=False, fp16=False, temperature=1.0, seed=42, num_sample_generations=0,
        missing_eos_penalty=1.0, stop_token=None, dataloader_num_workers=0, disable_tqdm=True,
    )
    timer = StepTimer(interleave)
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy, ref_model=ref, reward_model=reward,
                         value_model=value, train_dataset=Dataset.from_dict({"input_ids": ids}), callbacks=[timer])
    trainer.train()
    return timer.intervals


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))  # no toolkit import here
    parser.add_argument("--case", choices=["grpo", "ppo"], required=True)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--prompts", required=True, help="JSON lines with a `src` field")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--new_tokens", type=int, default=16)
    parser.add_argument("--config", required=True, help="JSON: prompts, samples, epochs and the KL coefficient")
    parser.add_argument("--interleave", action="store_true",
                        help=f"after each step print {STEP_SIGNAL!r} and wait for a line on stdin (not timed)")
    args = parser.parse_args(argv)
    import torch
    import transformers
    import trl

    cfg = json.loads(args.config)
    prompts = read_prompts(args.prompts)
    with tempfile.TemporaryDirectory(prefix="trl_step_") as out:
        run = run_grpo if args.case == "grpo" else run_ppo
        intervals = run(args.model_dir, prompts, args.steps, args.new_tokens, cfg, out, args.interleave)
    if len(intervals) < args.steps + 1:
        raise SystemExit(f"TRL ran {len(intervals)} steps, expected {args.steps + 1}")
    measured = intervals[1 : args.steps + 1]
    print(json.dumps({
        "step_s_median": round(statistics.median(measured), 4), "step_s_all": [round(x, 4) for x in measured],
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "torch_threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    sys.exit(main())
