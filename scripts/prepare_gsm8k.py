"""Turn GSM8K-style JSONL (`question`, `answer` ending `#### n`) into prompt data with reference answers.

    python scripts/prepare_gsm8k.py --input gsm8k/train.jsonl --output data/gsm8k_train.jsonl
    python scripts/prepare_gsm8k.py --input gsm8k/test.jsonl --output data/gsm8k_test.jsonl --template qwen

The counterpart of PaddleNLP's `llm/alignment/rl/gsm8k_processor.py`, for files already on disk
(it downloads `openai/gsm8k` with `datasets` and writes parquet-like JSONL): each record becomes a
`Jsonfile` record (docs/data.md)

    {"src": PROMPT, "tgt": "72", "answer": "<the full solution>", "index": 0}

with `tgt` the number after the first `#### ` of the answer, commas removed (that script's
`extract_solution`), the label the `gsm8k`, `gsm8k_flexible` and `math` verifiers check, and
`src` the question followed by the instruction
`Let's think step by step and output the final answer after "####".` With `--template plain`
(default) `src` is just that text, and the run's `prompt_template` or `use_chat_template` wraps
it; `--template qwen` writes the exact Qwen chat string PaddleNLP's script writes (system
prompt, user turn, open assistant turn), for runs with `prompt_template {input}`. A record whose
answer has no `#### n` is an error naming its line: the reward could not be computed from it.
"""
import argparse
import json
import os


from ppo.verifiers.gsm8k import gsm8k_label  # noqa: E402

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
QWEN_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"


def prompt_text(question, template):
    """The `src` of one question: plain text, or PaddleNLP's Qwen chat string."""
    if template == "plain":
        return f"{question} {INSTRUCTION}"
    return f"{QWEN_SYSTEM}<|im_start|>user\n{question} {INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"


def convert_record(record, index, template="plain", question_key="question", answer_key="answer"):
    """One GSM8K record -> `{"src", "tgt", "answer", "index"}`; ValueError when a field or `#### n` is missing."""
    question, answer = record.get(question_key), record.get(answer_key)
    if not isinstance(question, str) or not isinstance(answer, str):
        raise ValueError(f"needs string fields '{question_key}' and '{answer_key}', got keys {sorted(record)}")
    if "####" not in answer:
        raise ValueError(f"the answer has no '#### n' final line: {answer[-120:]!r}")
    return {"src": prompt_text(question, template), "tgt": gsm8k_label(answer), "answer": answer, "index": index}


def convert_file(path, output, template="plain", question_key="question", answer_key="answer"):
    """Convert every non-empty line of `path` into `output`; returns the number of records."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(convert_record(json.loads(line), len(rows), template, question_key, answer_key))
            except ValueError as err:
                raise SystemExit(f"{path}: line {line_no}: {err}") from None
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, help="GSM8K-style JSONL (question, answer with '#### n')")
    parser.add_argument("--output", required=True, help="Jsonfile JSONL to write (src, tgt, answer, index)")
    parser.add_argument("--template", choices=("plain", "qwen"), default="plain",
                        help="plain: question + instruction; qwen: PaddleNLP's Qwen chat string")
    parser.add_argument("--question_key", default="question")
    parser.add_argument("--answer_key", default="answer")
    args = parser.parse_args(argv)
    count = convert_file(args.input, args.output, args.template, args.question_key, args.answer_key)
    print(f"[prepare_gsm8k] {count} records -> {args.output}")
    return count


if __name__ == "__main__":
    main()
