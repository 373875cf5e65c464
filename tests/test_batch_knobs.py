"""PaddleNLP's RL batch knobs: `global_batch_size`, `global_mini_batch_size`,
`global_gen_batch_size`, `per_device_{logprob,reward,value}_batch_size`,
`rollout_max_num_seqs` and `balance_batch`. Each value is checked where it acts (the prompt
sampler, the optimiser plan, the row chunks the no-gradient passes see, the engine's decode
chunks, the rows each data rank holds), and chunked results against un-chunked ones."""
import numpy as np
import paddle
import pytest

import tests.rule_reward_helpers  # noqa: F401  (registers the test scorers)
from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments
from ppo.trainer.balance import balanced_partition, imbalance, trim_padding
from tests.rule_reward_helpers import read_metrics
from tests.demo_config_flags import PPO_AS_BEFORE
from tests.test_data_parallel import one_and_two_process_runs
from tests.test_tensor_parallel import assert_same_steps, assert_same_weights, assert_weights_moved, ppo_argv

CLASSES = (ModelArgument, DataArgument, PPOTrainingArguments)


def rule_grpo_argv(model_dir, data_dir, out, *extra):
    """A tiny GRPO run scored by response length in process; batch sizes come from `extra`."""
    return [
        "config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", model_dir,
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "1", "--max_dec_len", "6",
        "--evaluation_strategy", "no", "--save_steps", "0", "--num_sample_generations", "0", "--disable_tqdm", "true",
        "--rule_reward_scorers", "test_rule_len", *extra,
    ]


def parse(tmp_path, *flags):
    return parse_arguments(CLASSES, ["config/tiny/grpo_rule_argument.json", "--output_dir", str(tmp_path / "o"), *flags])[2]


# ---------------------------------------------------------------- arguments: meaning and conflicts


def test_global_batch_size_sets_the_prompts_per_rank(tmp_path):
    args = parse(tmp_path, "--global_batch_size", "16")  # the file's per_device_prompt_batch_size is 16 too
    assert args.per_device_prompt_batch_size == 16 and args.total_steps(64, 1) == 80  # max_steps of the file
    args = parse_arguments(CLASSES, ["--output_dir", str(tmp_path / "p"), "--global_batch_size", "6", "--rollout_n", "2",
                                     "--per_device_train_batch_size", "4"])[2]
    assert args.per_device_prompt_batch_size == 6
    # neither given: our default of 16 prompts per rank
    assert parse_arguments(CLASSES, ["--output_dir", str(tmp_path / "q")])[2].per_device_prompt_batch_size == 16


def test_global_batch_size_and_per_device_prompt_batch_size_that_disagree_are_one_error(tmp_path):
    with pytest.raises(ArgumentError) as info:
        parse(tmp_path, "--global_batch_size", "8")  # the file says 16 prompts per rank
    message = str(info.value)
    assert message == ("global_batch_size 8 over 1 data-parallel rank(s) gives 8 prompts per rank, but "
                       "per_device_prompt_batch_size is 16: give one of them")


@pytest.mark.parametrize("flags, accumulation, micro_rows", [
    # 16 prompts x 8 samples = 128 rows per rank; per_device_train_batch_size 128 (the file)
    ([], 1, 128),  # no mini-batch size: per_device_train_batch_size x gradient_accumulation_steps
    (["--global_mini_batch_size", "4"], 1, 32),  # 4 prompts x 8 = 32 rows per optimiser step: 4 steps
    (["--global_mini_batch_size", "8", "--per_device_train_batch_size", "16"], 4, 16),  # 64 rows: 4 x 16
    (["--global_batch_size", "16", "--per_device_train_batch_size", "32"], 4, 32),  # -1: the whole global batch
])
def test_mini_batch_size_gives_the_optimiser_plan(tmp_path, flags, accumulation, micro_rows):
    args = parse(tmp_path, *flags)
    assert (args.update_accumulation_steps, args.update_micro_rows) == (accumulation, micro_rows)


@pytest.mark.parametrize("flags, problem", [
    (["--global_mini_batch_size", "3"], "global_mini_batch_size 3 must split over 1 data-parallel rank(s) and divide the global batch of 16 prompts"),
    (["--global_mini_batch_size", "8", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "2"],
     "gradient_accumulation_steps 2 disagrees with the 4 micro-batches of 16 rows that global_mini_batch_size 8 x rollout_n 8 gives per rank: leave it out"),
    (["--global_mini_batch_size", "2", "--per_device_train_batch_size", "12"],
     "global_mini_batch_size 2 x rollout_n 8 gives 16 rows per rank per optimiser step, not a multiple of per_device_train_batch_size 12"),
    (["--global_gen_batch_size", "32"], "global_gen_batch_size 32 is DAPO's generation batch: it acts with dynamic_sampling only"),
    (["--global_gen_batch_size", "8", "--dynamic_sampling", "true"],
     "global_gen_batch_size 8 must split over 1 data-parallel rank(s) and be at least the global batch of 16 prompts"),
    (["--per_device_value_batch_size", "0"], "per_device_value_batch_size must be positive or -1, got 0"),
    (["--rollout_max_num_seqs", "-3"], "rollout_max_num_seqs must be positive or -1, got -3"),
])
def test_bad_batch_knobs_are_named(tmp_path, flags, problem):
    with pytest.raises(ArgumentError) as info:
        parse(tmp_path, *flags)
    assert problem in str(info.value)


# ---------------------------------------------------------------- the values act where they should


@pytest.fixture(scope="module")
def knob_trainer(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """A tiny rule-scored GRPO trainer: 4 prompts x 4 samples, log-prob passes in chunks of 3
    rows, rollouts decoded 5 rows at a time, mini-batches of 2 prompts."""
    from ppo.run_ppo import build_trainer

    out = str(tmp_path_factory.mktemp("knobs"))
    return build_trainer(rule_grpo_argv(
        tiny_model_dir, tiny_data_dir, out, "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
        "--per_device_train_batch_size", "4", "--global_mini_batch_size", "2", "--update_iters", "1",
        "--per_device_logprob_batch_size", "3", "--rollout_max_num_seqs", "5", "--temperature", "1.3",
    ))


def test_logprob_passes_see_micro_batches_and_match_one_pass(knob_trainer, monkeypatch):
    import ppo.passes.plain as plain

    trainer = knob_trainer
    exp = trainer.experience.rollout.generate()
    seen, real = [], plain.response_logprobs
    monkeypatch.setattr(plain, "response_logprobs", lambda model, e, *a, **k: (seen.append(len(e)), real(model, e, *a, **k))[1])
    with paddle.no_grad():
        chunked = trainer.passes.logprobs("actor", exp)
        assert seen == [3, 3, 3, 3, 3, 1]  # 16 rows in chunks of per_device_logprob_batch_size 3
        monkeypatch.setitem(trainer.passes.chunk_rows, "logprob", 64)
        whole = trainer.passes.logprobs("actor", exp)
    assert seen[6:] == [16] and chunked.shape == whole.shape == exp.response_ids.shape
    np.testing.assert_allclose(chunked.numpy(), whole.numpy(), atol=1e-5)


def test_rollout_max_num_seqs_decodes_in_chunks_with_the_same_tokens(knob_trainer, monkeypatch):
    trainer = knob_trainer
    engine, batch = trainer.experience.rollout.engine, trainer.experience.rollout.collate([trainer.experience.rollout.dataset[i] for i in range(6)])
    ids, mask = (paddle.repeat_interleave(batch[k], 2, axis=0) for k in ("input_ids", "attention_mask"))
    calls, real = [], type(engine)._generate_engine

    def spy(self, lm, input_ids, *a, **k):
        calls.append(input_ids.shape[0])
        return real(self, lm, input_ids, *a, **k)

    monkeypatch.setattr(type(engine), "_generate_engine", spy)
    chunked = engine.generate(ids, mask, trainer.experience.rollout.sampling, seed=7, row_offset=12, total_rows=36)
    assert calls == [5, 5, 2] and chunked.stats["chunks"] == 3  # 12 rows, rollout_max_num_seqs 5
    monkeypatch.setattr(engine, "max_num_seqs", -1)
    whole = engine.generate(ids, mask, trainer.experience.rollout.sampling, seed=7, row_offset=12, total_rows=36)
    assert calls[3:] == [12]
    assert chunked.response_ids.shape == whole.response_ids.shape
    np.testing.assert_array_equal(chunked.response_ids.numpy(), whole.response_ids.numpy())
    np.testing.assert_array_equal(chunked.sequences.numpy(), whole.sequences.numpy())
    np.testing.assert_array_equal(chunked.attention_mask.numpy(), whole.attention_mask.numpy())
    np.testing.assert_allclose(chunked.response_logprobs.numpy(), whole.response_logprobs.numpy(), atol=1e-5)


def test_mini_batches_give_optimiser_steps_per_rollout(knob_trainer):
    trainer = knob_trainer
    plan = trainer.learner.minibatch_plan(16, 0)  # 2 prompts x 4 samples = 8 rows per step: 2 micro-batches of 4
    assert [[len(mb) for mb in step] for step in plan] == [[4, 4], [4, 4]]
    assert sorted(r for step in plan for mb in step for r in mb) == list(range(16))


def test_global_gen_batch_size_draws_the_generation_batch(tiny_model_dir, tiny_data_dir, tmp_path):
    """DAPO: 8 prompts generated per draw, the 4 that fill the batch kept (groups whose
    length scores vary first)."""
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "gen")
    trainer = build_trainer(rule_grpo_argv(
        tiny_model_dir, tiny_data_dir, out, "--per_device_prompt_batch_size", "4", "--rollout_n", "4", "--per_device_train_batch_size",
        "16", "--dynamic_sampling", "true", "--global_gen_batch_size", "8", "--max_gen_batches", "1",
    ))
    assert trainer.experience.rollout.sampler.batch_size == 8 and trainer.experience.settings.per_device_prompt_batch_size == 4
    exp, draws = trainer.experience.sample()
    assert draws == 1 and len(exp) == 16 and trainer.experience.rollout.sampler.state_dict()["offset"] == 8


def test_value_and_reward_passes_use_their_own_sizes(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path, monkeypatch):
    import ppo.passes.plain as plain
    from ppo.run_ppo import build_trainer

    trainer = build_trainer([
        "config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(tiny_model_dir, tiny_data_dir),
        "--reward_model_name_or_path", tiny_rm_dir,
        "--output_dir", str(tmp_path / "ppo"), "--logging_dir", str(tmp_path / "ppo" / "vdl"), "--per_device_prompt_batch_size", "6", "--per_device_train_batch_size", "6",
        "--per_device_value_batch_size", "4", "--per_device_reward_batch_size", "5", "--per_device_logprob_batch_size", "2",
    ])
    assert trainer.passes.chunk_rows == {"logprob": 2, "value": 4, "reward": 5}
    exp = trainer.experience.rollout.generate()
    seen = {"value": [], "reward": []}
    real_values, real_scores = plain.response_values, plain.reward_scores
    monkeypatch.setattr(plain, "response_values", lambda m, e, **k: (seen["value"].append(len(e)), real_values(m, e, **k))[1])
    monkeypatch.setattr(plain, "reward_scores", lambda m, e, r: (seen["reward"].append(len(e)), real_scores(m, e, r))[1])
    with paddle.no_grad():
        values, scores = trainer.passes.values("reward", exp), trainer.passes.scores("reward", exp)
        monkeypatch.setitem(trainer.passes.chunk_rows, "value", 6)
        monkeypatch.setitem(trainer.passes.chunk_rows, "reward", 6)
        whole_values, whole_scores = trainer.passes.values("reward", exp), trainer.passes.scores("reward", exp)
    assert seen == {"value": [4, 2, 6], "reward": [5, 1, 6]}
    np.testing.assert_allclose(values.numpy(), whole_values.numpy(), atol=1e-5)
    np.testing.assert_allclose(scores.numpy(), whole_scores.numpy(), atol=1e-5)


# ---------------------------------------------------------------- balance_batch


def test_balanced_partition_by_hand():
    # longest first: 9 -> p0, 8 -> p1, 7 -> p2, 3 -> p2 (7 smallest), 2 -> p1 (8 < 9), 1 -> p0: sums 10, 10, 10
    assert balanced_partition([9, 8, 7, 3, 2, 1], 3) == [[0, 5], [1, 4], [2, 3]]
    assert balanced_partition([5, 5, 1, 1], 2) == [[0, 2], [1, 3]]  # 6 / 6, not 10 / 2
    assert balanced_partition([4, 4, 4, 4], 1) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="5 items do not split into 2 equal parts"):
        balanced_partition([1, 2, 3, 4, 5], 2)
    assert imbalance([10, 10]) == 1.0 and imbalance([15, 5]) == 1.5


def test_balanced_partition_is_never_worse_than_contiguous_ranks():
    rng = np.random.RandomState(0)
    for _ in range(50):
        lengths = rng.randint(1, 100, size=16).tolist()
        parts = balanced_partition(lengths, 4)
        assert sorted(i for p in parts for i in p) == list(range(16)) and all(len(p) == 4 for p in parts)
        sums = [sum(lengths[i] for i in p) for p in parts]
        contiguous = [sum(lengths[4 * r : 4 * r + 4]) for r in range(4)]
        assert max(sums) <= max(contiguous) and max(sums) - min(sums) <= max(lengths)


def test_trim_padding_keeps_the_real_tokens(knob_trainer):
    from ppo.experience import pad_experience

    exp = knob_trainer.experience.rollout.generate()
    tight = trim_padding(exp)
    assert bool(tight.attention_mask[:, 0].astype("bool").any())  # no prompt column is padding in every row
    assert tight.response_ids.shape[1] == int(exp.response_mask.sum(axis=1).max())
    wide = pad_experience(exp, exp.prompt_len + 3, exp.response_ids.shape[1] + 2, knob_trainer.experience.rollout.tokenizer.pad_token_id)
    back = trim_padding(wide)
    assert back.prompt_len == tight.prompt_len
    for name in ("sequences", "attention_mask", "position_ids", "response_ids", "response_mask", "old_logprobs"):
        if getattr(tight, name) is not None:
            np.testing.assert_array_equal(getattr(back, name).numpy(), getattr(tight, name).numpy(), err_msg=name)


@pytest.mark.slow
def test_balance_batch_on_two_ranks_evens_tokens_and_trains_as_one_process(tiny_model_dir, tiny_data_dir, tmp_path):
    """Two data ranks with balance_batch: the groups move between ranks for even token counts
    (the logged imbalance falls), and since every loss is a token mean over the global batch
    (one micro-batch per optimiser step), losses and weights equal the one-process run's."""
    argv = ["config/tiny/grpo_rule_argument.json", *ppo_argv(
        tiny_model_dir, tiny_data_dir, "--rollout_n", "4", "--gradient_accumulation_steps", "1", "--learning_rate", "1e-3",
        "--kl_loss_coeff", "0.05", "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer",
        "--overwrite_output_dir", "true", "--balance_batch", "true", "--max_dec_len", "10", "--min_dec_len", "1",
    )]
    out1, out2 = one_and_two_process_runs(
        "ppo/run_ppo.py", argv, tmp_path, {"--per_device_prompt_batch_size": 8, "--per_device_train_batch_size": 32})
    for key in ("loss/policy_avg", "objective/scores", "loss/kl", "policy/entropy_avg", "train/actor_grad_norm"):
        assert_same_steps(out1, out2, key, 2)
    assert_same_weights(f"{out1}/policy", f"{out2}/policy")
    assert_weights_moved(tiny_model_dir, f"{out2}/policy")
    rows = read_metrics(out2)
    assert len(rows) == 2 and all("rollout/rank_token_imbalance" not in r for r in read_metrics(out1))
    for r in rows:
        assert 1.0 <= r["rollout/rank_token_imbalance"] <= r["rollout/rank_token_imbalance_before"]
    assert any(r["rollout/rank_token_imbalance"] < r["rollout/rank_token_imbalance_before"] for r in rows)


def test_knobs_that_cannot_act_say_so_once():
    from types import SimpleNamespace

    from ppo.common.paddlenlp_keys import batch_knob_messages

    args = SimpleNamespace(balance_batch=True, dataset_world_size=1, per_device_reward_batch_size=4)
    assert batch_knob_messages(SimpleNamespace(external_scores=True), args) == [
        "balance_batch does nothing with one data-parallel rank: it holds every rollout row",
        "per_device_reward_batch_size does nothing here: scores come from a reward server or rule scorers, not a "
        "reward-model forward",
    ]
    acting = SimpleNamespace(balance_batch=True, dataset_world_size=2, per_device_reward_batch_size=4)
    assert batch_knob_messages(SimpleNamespace(external_scores=False), acting) == []


def test_pass_sizes_under_pipeline_parallel_are_refused_by_name():
    """The no-gradient passes run through the pipeline schedule there: a row chunk size cannot act."""
    from types import SimpleNamespace

    from ppo.entry.ppo_argument_checks import pass_size_problems

    sizes = dict(per_device_logprob_batch_size=4, per_device_reward_batch_size=-1, per_device_value_batch_size=2)
    problems = pass_size_problems(SimpleNamespace(pipeline_parallel_degree=2, **sizes))
    assert [p.split(" ")[:2] for p in problems] == [["per_device_logprob_batch_size", "4"], ["per_device_value_batch_size", "2"]]
    assert all("pipeline_parallel_degree 2" in p and "leave" in p for p in problems)
    assert pass_size_problems(SimpleNamespace(pipeline_parallel_degree=1, **sizes)) == []
