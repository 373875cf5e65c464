"""Load exported Hugging Face directories in transformers and write their outputs (run in a separate
process with a Python that has torch and transformers; Paddle and torch never share a process here).

    python tests/hf_transformers_check.py JOB.json

JOB.json: a list of `{"dir", "kind": "causal" | "score" | "build", "input_ids", "attention_mask", "out"}`;
a "build" job first writes a random model of its `config` into `dir` (see `build`), then runs as
"causal". Each writes `out` (.npz): `logits` [B, T, V] of `AutoModelForCausalLM`, or `scores` [B] of
`AutoModelForSequenceClassification` (one label, at each row's last real token), and
`class_name`, `tied` (whether the LM head shares the embedding weight). A job with
`"texts"` also writes `token_ids` of `AutoTokenizer` (no special tokens), one list per text; the
slow (SentencePiece) tokenizer unless the directory has a `tokenizer.json` or the job says
`"fast": true` (transformers converts only BPE and Unigram SentencePiece models to a fast one,
and the tiny model's is a character model).
"""
import json
import os
import sys

import numpy as np
import torch
import transformers


def build(job):
    """A random model of `job["config"]` (a transformers config dict with `model_type`) saved in
    `job["dir"]`: every weight N(0, 0.2), norms around 1 (q/k norms included), so no name
    mix-up hides behind an initial value. `"legacy_rope": true` rewrites `config.json` in
    transformers 4's layout (`rope_theta` at the top, no `rope_parameters` / `layer_types`)."""
    torch.manual_seed(job.get("seed", 0))
    fields = dict(job["config"])
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape)
            param.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)
    model.save_pretrained(job["dir"])
    if job.get("legacy_rope"):
        path = os.path.join(job["dir"], "config.json")
        with open(path) as f:
            saved = json.load(f)
        saved["rope_theta"] = saved.pop("rope_parameters")["rope_theta"]
        saved["rope_scaling"] = None
        saved.pop("layer_types", None)
        with open(path, "w") as f:
            json.dump(saved, f, indent=2)


def run(job):
    if job["kind"] == "build":
        build(job)
        job = dict(job, kind="causal")
    ids = torch.tensor(job["input_ids"])
    mask = torch.tensor(job["attention_mask"])
    out = {}
    with torch.no_grad():
        if job["kind"] == "causal":
            model = transformers.AutoModelForCausalLM.from_pretrained(job["dir"], dtype=torch.float32)
            out["logits"] = model(input_ids=ids, attention_mask=mask).logits.numpy()
            out["tied"] = np.array(model.lm_head.weight is model.model.embed_tokens.weight)
        else:
            model = transformers.AutoModelForSequenceClassification.from_pretrained(job["dir"], dtype=torch.float32)
            out["scores"] = model(input_ids=ids, attention_mask=mask).logits[:, 0].numpy()
            out["tied"] = np.array(False)
    out["class_name"] = np.array(type(model).__name__)
    out["version"] = np.array(transformers.__version__)
    if job.get("texts"):
        fast = os.path.isfile(os.path.join(job["dir"], "tokenizer.json")) or job.get("fast", False)
        tokenizer = transformers.AutoTokenizer.from_pretrained(job["dir"], use_fast=fast)
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in job["texts"]]
        out["token_ids"] = np.array(json.dumps(ids))
    np.savez(job["out"], **out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        for job in json.load(f):
            run(job)
