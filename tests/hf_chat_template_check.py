"""Render chat templates with transformers' `apply_chat_template` (run in a separate process with a
Python that has transformers; Paddle and torch never share a process here).

    python tests/hf_chat_template_check.py JOB.json OUT.json

JOB.json: a list of `{"dir", "messages", "tools", "add_generation_prompt", "kwargs"}`; OUT.json: one
`{"text", "ids"}` per job: the rendered text (`tokenize=False`) and its ids from the same
tokenizer (`add_special_tokens=False`).
"""
import json
import sys

import transformers


def main(job_path, out_path):
    with open(job_path) as f:
        jobs = json.load(f)
    tokenizers, out = {}, []
    for job in jobs:
        if job["dir"] not in tokenizers:
            tokenizers[job["dir"]] = transformers.AutoTokenizer.from_pretrained(job["dir"])
        tok = tokenizers[job["dir"]]
        text = tok.apply_chat_template(job["messages"], tools=job.get("tools"), tokenize=False,
                                       add_generation_prompt=job["add_generation_prompt"], **job.get("kwargs", {}))
        out.append({"text": text, "ids": tok(text, add_special_tokens=False)["input_ids"]})
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
