"""Process reward models: PaddleNLP's PRM data format and keys, the tokenised layout (score read at
each placeholder), the start-up checks, the PRM scorer of PPO/GRPO (the same scores as training's
layout), the step-accuracy audit and the demo's data (its accuracy: docs/paddlenlp.md)."""
import json
import os

import numpy as np
import paddle
import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.data import ProcessRewardDataset
from ppo.data.process_reward import step_labels_from_text
from ppo.scoring.process_reward import ProcessRewardScorer, step_token_groups
from tests.test_paddlenlp_dropin import entry_classes, fixture


def write(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from ppo.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def test_labels_from_math_shepherd_text():
    pieces = ["Q: 1+1? Step 1: 2 ", "\nStep 2: 3 ", ""]
    label = "Q: 1+1? Step 1: 2 +\nStep 2: 3 -"
    assert step_labels_from_text(pieces, label, ("+", "-")) == [1, 0]
    with pytest.raises(ValueError, match="differs from 'input' in step 2"):
        step_labels_from_text(pieces, "Q: 1+1? Step 1: 2 +\nStep 9: 3 -", ("+", "-"))
    with pytest.raises(ValueError, match="expected one of"):
        step_labels_from_text(pieces, "Q: 1+1? Step 1: 2 ?\nStep 2: 3 -", ("+", "-"))


def test_dataset_reads_scores_at_each_placeholder(tokenizer, tmp_path):
    path = write(tmp_path / "prm.jsonl", [
        {"input": "USER: Reverse: abc ASSISTANT:cb|a|", "label": "USER: Reverse: abc ASSISTANT:cb+a-"},
        {"input": "USER: Reverse: de ASSISTANT:ed|", "label": ["+"]},
    ])
    ds = ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, max_length=64, placeholder_token="|",
                              reward_tokens="+,-")
    bar = tokenizer("|", add_special_tokens=False)["input_ids"][0]
    item = ds[0]
    ids = item["input_ids"].tolist()
    assert [ids[p] for p in item["step_positions"]] == [bar, bar] and item["step_labels"].tolist() == [1.0, 0.0]
    assert tokenizer.convert_ids_to_tokens(ids[item["step_positions"][0] - 2:item["step_positions"][0]]) == ["c", "b"]
    assert ids[0] == tokenizer.bos_token_id and ids.count(bar) == 2
    batch = ds.get_collator()([ds[0], ds[1]])
    assert batch["step_positions"].shape == [2, 2] and batch["step_mask"].numpy().tolist() == [[1, 1], [1, 0]]
    assert batch["step_labels"].dtype == paddle.float32 and batch["step_labels"].numpy().tolist() == [[1, 0], [1, 0]]


def test_long_records_keep_the_steps_that_fit(tokenizer, tmp_path):
    path = write(tmp_path / "prm.jsonl", [{"input": "Q ab|cd|ef|", "label": "Q ab+cd+ef-"}])
    whole = ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, max_length=64, placeholder_token="|")
    n = len(whole[0]["input_ids"])
    cut = ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, max_length=n - 1, placeholder_token="|")
    assert len(cut[0]["step_positions"]) == 2 and cut.stats["truncated_steps"] == 1
    short = ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, max_length=64, placeholder_token="|",
                                 truncate_prompt_to=2)
    assert short[0]["input_ids"].tolist()[:3] == whole[0]["input_ids"].tolist()[3:6] and short.stats["truncated_prompt"] == 1


def test_bad_records_and_tokens_are_errors(tokenizer, tmp_path):
    path = write(tmp_path / "prm.jsonl", [{"input": "Q ab|", "label": "Q ab+"}, {"input": "Q no steps", "label": "Q no steps"}])
    with pytest.raises(ValueError, match=r"prm.jsonl, line 2.*holds no placeholder_token"):
        ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, placeholder_token="|")
    with pytest.raises(ValueError, match="placeholder_token 'ки' is 1 token.s. .0. for this tokenizer"):
        ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, placeholder_token="ки")
    with pytest.raises(ValueError, match="reward_tokens must name two different tokens"):
        ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, placeholder_token="|", reward_tokens="+")


def test_demo_data_labels_steps_and_writes_the_stepped_task(tmp_path):
    """`ppo.tiny.prm_data`: each step's mark says whether it holds the correct answer's characters at
    its place (a step past the answer's end is bad); the empty last step whether the answer stops
    where the correct one does; `prm_sft.jsonl` / `prm_test.jsonl` are the train / held-out strings'
    correct answers in the same steps (the PRM's starting model learns that layout), held-out
    strings in no train file."""
    from ppo.tiny import prm_data

    counts = prm_data.generate(str(tmp_path), num_train=400, num_eval=10)
    assert counts == {"prm_train.jsonl": 400, "prm_eval.jsonl": 10, "prm_sft.jsonl": 400, "prm_test.jsonl": 10}
    read = lambda name: [json.loads(line) for line in open(tmp_path / name)]  # noqa: E731
    assert prm_data.stepped("q9x3k") == "q9|x3|k|" and prm_data.stepped("ab", end_step=True) == "ab||"
    assert prm_data.step_marks("q9x3", "q9x3k", True) == ["+", "+", "-"]  # stopped early: the end step is bad
    assert prm_data.step_marks("q9x3kz", "q9x3k", True) == ["+", "+", "-", "-"]  # ran on: so is the step past the end
    lengths = {"short": 0, "same": 0, "long": 0}
    for r in read("prm_train.jsonl") + read("prm_eval.jsonl"):
        prompt, answer = r["input"].split("ASSISTANT:")
        right = prompt.split("Reverse: ")[1].strip()[::-1]
        assert answer.endswith("||") or answer == "|"
        steps, marks = answer.split("|")[:-2], [m for m in r["label"].split("ASSISTANT:")[1] if m in "+-"]
        truth = prm_data.steps_of(right)
        got = "".join(steps)
        lengths["short" if len(got) < len(right) else "long" if len(got) > len(right) else "same"] += 1
        assert marks[:-1] == ["+" if i < len(truth) and s == truth[i] else "-" for i, s in enumerate(steps)]
        assert marks[-1] == ("+" if len(got) == len(right) else "-")
    assert lengths["same"] > 250 and lengths["short"] > 40 and lengths["long"] > 10  # length_frac 0.25: 3 in 4 short
    sft, test = read("prm_sft.jsonl"), read("prm_test.jsonl")
    train_strings = [r["src"][0] for r in sft]
    assert [r["input"].split(" ASSISTANT:")[0][len("USER: "):] for r in read("prm_train.jsonl")] == train_strings
    assert all(r["tgt"][0] == prm_data.stepped(r["src"][0][len("Reverse: "):][::-1]) for r in sft + test)
    assert not set(train_strings) & {r["src"][0] for r in test}


def test_paddlenlp_prm_file_reads_its_data_as_step_labelled(tmp_path):
    _, data, _ = parse_arguments(entry_classes("rm"), [fixture("llama/prm_flashmask_argument.json"),
                                                       "--output_dir", str(tmp_path), "--bf16", "false"])
    assert data.train_datasets == ["paddlenlp-prm:1:./data/Math-Shepherd/test.json"]
    assert (data.placeholder_token, data.reward_tokens, data.truncate_prompt_len) == ("ки", "+,-", 2048)


def test_process_reward_refuses_what_the_step_loss_cannot_use(tmp_path):
    from rm.process_reward_checks import process_reward_problems
    from rm.reward_arguments import DataArgument, ModelArgument, RewardTrainingArguments

    with pytest.raises(ArgumentError) as info:
        parse_arguments((ModelArgument, DataArgument, RewardTrainingArguments),
                        ["--output_dir", str(tmp_path), "--placeholder_token", "#"], validate=lambda m, d, t: process_reward_problems(m, d, t))
    assert "placeholder_token is a process_reward setting" in str(info.value)
    model, data, train = parse_arguments((ModelArgument, DataArgument, RewardTrainingArguments),
                                         ["--output_dir", str(tmp_path), "--process_reward", "true", "--zero_padding", "true",
                                          "--loss_type", "token-wise", "--train_datasets", "PKU-SafeRLHF/train"])
    problems = process_reward_problems(model, data, train)
    assert any("zero_padding" in p for p in problems) and any("loss_type token-wise" in p for p in problems)
    assert any("dataset 'PKU-SafeRLHF/train' has none: read Math-Shepherd-format files as paddlenlp-prm" in p for p in problems)


def test_step_token_groups():
    assert step_token_groups(["a", "b", "\nc", "d"], "\n") == [[0, 1], [2, 3]]
    assert step_token_groups(["\n", "a"], "\n") == [[0, 1]]  # a leading separator starts no empty step
    assert step_token_groups([], "\n") == [[]]  # an empty response is one empty step


@pytest.fixture(scope="module")
def prm_model(tiny_rm_dir):
    from ppo.models.adapters import load_merged_score_model

    model = load_merged_score_model(tiny_rm_dir)
    model.config.process_reward, model.config.placeholder_token, model.config.reward_tokens = True, "|", "+,-"
    model.eval()
    return model


def test_scorer_gives_the_scores_of_the_training_layout(prm_model, tokenizer, tmp_path):
    """The scorer cuts a response's tokens at the separator and scores the PRM's text layout: the same
    logits as the dataset path `rm/run_reward.py --process_reward` trains on."""
    from rm.process_reward_trainer import step_logits

    prompt = "USER: Reverse: abc ASSISTANT:"
    response = tokenizer("cb;a", add_special_tokens=False)["input_ids"]
    scores = ProcessRewardScorer(prm_model, tokenizer, step_separator=";").score([prompt, prompt], [response, []])
    path = write(tmp_path / "prm.jsonl", [{"input": prompt + "cb|;a|", "label": ["+", "-"]}])
    ds = ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, placeholder_token="|")
    want = step_logits(prm_model, ds.get_collator()([ds[0]])).numpy()[0]
    np.testing.assert_allclose(scores.scores.numpy()[0], 1 / (1 + np.exp(-want)), rtol=1e-6)
    assert scores.mask.numpy().tolist() == [[1, 1], [1, 0]]
    assert scores.ends.numpy()[0].tolist() == [1, 3]  # 'c','b' | ';','a': the last token of each step
    with pytest.raises(ValueError, match="not a process reward model"):
        prm_model.config.process_reward = False
        try:
            ProcessRewardScorer(prm_model, tokenizer)
        finally:
            prm_model.config.process_reward = True


def test_end_step_scores_where_the_answer_stops(prm_model, tokenizer, tmp_path):
    """`end_step`: a response that ended with EOS gets an empty last step at its EOS token, scored in
    the layout the demo's PRM data trains (`q9|x3||`); an answer cut by the length limit gets none,
    and an answer of EOS alone is that one step."""
    from rm.process_reward_trainer import step_logits

    prompt = "USER: Reverse: abc ASSISTANT:"
    cb = tokenizer("cb", add_special_tokens=False)["input_ids"]
    scorer = ProcessRewardScorer(prm_model, tokenizer, step_tokens=1, end_step=True)
    scores = scorer.score([prompt] * 3, [cb, cb, []], ended=[True, False, True])
    path = write(tmp_path / "prm.jsonl", [{"input": prompt + "c|b||", "label": ["+", "+", "-"]},
                                          {"input": prompt + "|", "label": ["-"]}])
    ds = ProcessRewardDataset(f"paddlenlp-prm:1:{path}", tokenizer, placeholder_token="|")
    want = step_logits(prm_model, ds.get_collator()([ds[0]])).numpy()[0]
    np.testing.assert_allclose(scores.scores.numpy()[0], 1 / (1 + np.exp(-want)), rtol=1e-6)
    want_empty = step_logits(prm_model, ds.get_collator()([ds[1]])).numpy()[0]
    np.testing.assert_allclose(scores.scores.numpy()[2, :1], 1 / (1 + np.exp(-want_empty)), rtol=1e-6)
    assert scores.mask.numpy().tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0]]
    assert scores.ends.numpy()[:, 0].tolist() == [0, 0, 0] and scores.ends.numpy()[0].tolist() == [0, 1, 2]
    # token_steps: the EOS token (index 2 of row 0) carries the end step's score; row 1 has no EOS
    eos = tokenizer.eos_token_id
    ids = paddle.to_tensor([cb + [eos], cb + [cb[0]], [eos, 0, 0]], dtype="int64")
    mask = paddle.to_tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0]], dtype="int64")
    rewards, marks = scorer.token_steps([prompt] * 3, ids, mask, eos)
    assert marks.numpy().tolist() == [[1, 1, 1], [1, 1, 1], [1, 0, 0]]
    np.testing.assert_allclose(rewards.numpy()[0], scores.scores.numpy()[0], rtol=1e-6)
    without = ProcessRewardScorer(prm_model, tokenizer, step_tokens=1).token_steps([prompt] * 3, ids, mask, eos)[1]
    assert without.numpy().tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]  # the EOS is not scored


def test_audit_reports_step_accuracy(prm_model, tokenizer, tmp_path):
    from rm.audit_steps import audit_process_reward, first_error_accuracy

    path = write(tmp_path / "prm.jsonl", [{"input": "Q ab|cd|", "label": "Q ab+cd-"}, {"input": "Q ef|", "label": "Q ef+"}])
    report = audit_process_reward(prm_model, tokenizer, f"paddlenlp-prm:1:{path}")
    assert report["num_records"] == 2 and report["num_steps"] == 3
    assert 0.0 <= report["step_accuracy"] <= 1.0 and "bad_step_accuracy" in report
    # first_error_accuracy: response 0's first bad step is 1; predicted bad (logit <= 0) first at 1 -> hit
    hit = first_error_accuracy([np.array([2.0, -1.0])], [np.array([1.0, 0.0])], [np.array([1, 1])])
    miss = first_error_accuracy([np.array([-2.0, -1.0])], [np.array([1.0, 0.0])], [np.array([1, 1])])
    assert (hit, miss) == (1.0, 0.0)


def test_audit_command_on_a_process_reward_model(prm_model, tokenizer, tmp_path):
    from rm.audit_reward import main

    model_dir = str(tmp_path / "prm")
    prm_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    path = write(tmp_path / "prm.jsonl", [{"input": "Q ab|cd|", "label": "Q ab+cd-"}])
    report = main(["--model_name_or_path", model_dir, "--eval_datasets", f"paddlenlp-prm:1:{path}",
                   "--output_dir", str(tmp_path / "audit")])
    assert report["num_steps"] == 2 and os.path.isfile(tmp_path / "audit" / "audit.json")
