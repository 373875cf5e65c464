"""Pipeline parallel in the entry points: a pipeline_parallel_degree 2 run (two CPU processes,
fleet's 1F1B schedule through PaddleNLP's Trainer, the test-only stand-ins of
`tests/tp_cpu_collectives.install_pipeline`) and a plain one-process run from the same
checkpoint and data give the same per-step losses, the same evaluation loss and the same
saved weights; the PP=2 checkpoint is one plain checkpoint that loads on one process.

Micro-batches: `per_device_train_batch_size` rows each, `gradient_accumulation_steps` of them
per step in both runs (the plain Trainer accumulates them, the schedule pipelines them).
PaddleNLP sets `per_device_eval_batch_size` to their product under pipeline parallelism, so
the plain run is given that evaluation batch size too; the evaluation sets (90% of the fixture's)
do not fill the last batch, which the pipeline evaluation takes as it is."""
import json
import os

import numpy as np
import paddle
import pytest

from ppo.common.validation import pipeline_problems
from ppo.strategy.pipeline.pipe import AnswerNLLCriterion, CausalLMPipelineInputs, pipe_classes
from tests.tp_launch import launch_run, step_values

MICRO, ACCUMULATE, STEPS = 4, 2, 3
PP_ARGS = ["--pipeline_parallel_degree", "2", "--pipeline_parallel_config", "disable_p2p_cache_shape"]
LAYOUTS = {"pp2": (PP_ARGS, 2), "tp2_pp2": ((*PP_ARGS, "--tensor_parallel_degree", "2"), 4)}
"""Layout name -> (arguments, processes)."""


def saved_weights(path):
    return {k: v.numpy() for k, v in paddle.load(os.path.join(path, "model_state.pdparams")).items()}


def assert_same_saved_weights(dir_pp1, dir_pp2, start_dir, atol=1e-6):
    a, b, start = saved_weights(dir_pp1), saved_weights(dir_pp2), saved_weights(start_dir)
    assert sorted(a) == sorted(b) == sorted(start)  # merged: the plain model's keys, nothing per stage
    for key in a:
        assert a[key].shape == b[key].shape, key
        np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=atol, err_msg=key)
    assert any(not np.allclose(start[k], b[k]) for k in b)  # the run trained
    assert not any(f.startswith("model_state.pp") for f in os.listdir(dir_pp2))


def assert_same_steps(out1, out2, key):
    v1, v2 = step_values(out1, key), step_values(out2, key)
    assert sorted(v1) == sorted(v2) == list(range(1, STEPS + 1)), (v1, v2)
    np.testing.assert_allclose([v2[s] for s in v1], [v1[s] for s in v1], rtol=1e-5, err_msg=key)
    assert v1[STEPS] < v1[1]


def entry_argv(config, model_dir, train, evaluation, *extra):
    """The arguments both runs of a comparison share: STEPS steps of ACCUMULATE micro-batches of
    MICRO rows (pairs), a log every step, evaluation and save at the end."""
    return [
        config, "--model_name_or_path", model_dir, "--train_datasets", train, "--eval_datasets", evaluation,
        "--max_steps", str(STEPS), "--per_device_train_batch_size", str(MICRO),
        "--gradient_accumulation_steps", str(ACCUMULATE), "--per_device_eval_batch_size", str(MICRO * ACCUMULATE),
        "--logging_steps", "1", "--learning_rate", "1e-2", "--eval_steps", str(STEPS), "--save_steps", str(STEPS),
        "--warmup_steps", "0", "--disable_tqdm", "true", *extra,
    ]


def run_plain(main, argv, out1):
    main([*argv, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    return out1


def run_plain_and_pipeline(main, script, argv, tmp_path, parallel=PP_ARGS, nproc=2, out1=None):
    """`main(argv)` in this process (unless its output `out1` is given) and `script` with the
    `parallel` arguments (pipeline_parallel_degree 2) on `nproc` processes; returns their output
    directories."""
    out2 = str(tmp_path / "pp2")
    if out1 is None:
        out1 = run_plain(main, argv, str(tmp_path / "pp1"))
    launch_run(script, [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", *parallel], out2, nproc=nproc)
    return out1, out2


def final_eval(out, key):
    return json.load(open(os.path.join(out, "summary.json")))["final_eval"][key]


def sft_argv(model_dir, data_dir):
    return entry_argv(
        "config/tiny/sft_argument.json", model_dir, f"Jsonfile:1.0:{data_dir}/sft.jsonl",
        f"Jsonfile:0.9:{data_dir}/test.jsonl", "--eval_max_new_tokens", "6",
    )


@pytest.fixture(scope="module")
def sft_pp1(two_layer_model_dir, tiny_data_dir, tmp_path_factory):
    """The one-process SFT run both layouts below are held to (same arguments: run once)."""
    from sft.run_sft import main as run_sft

    return run_plain(run_sft, sft_argv(two_layer_model_dir, tiny_data_dir), str(tmp_path_factory.mktemp("sft_pp1")))


@pytest.mark.parametrize("layout", ["pp2", pytest.param("tp2_pp2", marks=pytest.mark.slow)])
def test_sft_pp2_matches_pp1(two_layer_model_dir, tiny_data_dir, sft_pp1, tmp_path, layout):
    """PP=2 on two processes, and TP=2 x PP=2 on four (each stage's weights split in two, merged
    back for the generation evaluation and the saved checkpoint)."""
    from paddlenlp.transformers import LlamaForCausalLM

    argv = sft_argv(two_layer_model_dir, tiny_data_dir)
    out1, out2 = run_plain_and_pipeline(None, "sft/run_sft.py", argv, tmp_path, *LAYOUTS[layout], out1=sft_pp1)
    assert_same_steps(out1, out2, "loss/sft")
    np.testing.assert_allclose(final_eval(out2, "eval/loss"), final_eval(out1, "eval/loss"), rtol=1e-5)
    for key in ("eval/accuracy", "eval/response_length"):  # greedy decoding of the stages gathered on each rank
        assert final_eval(out2, key) == final_eval(out1, key), key
    assert [json.loads(line)["response"] for line in open(os.path.join(out2, "eval_samples.jsonl"))] == [
        json.loads(line)["response"] for line in open(os.path.join(out1, "eval_samples.jsonl"))
    ]
    # atol 1e-5: Adam divides each gradient by its own running scale, so a near-zero gradient's
    # float rounding (a micro-batch's summed NLL x its step weight on the last stage, against the
    # plain trainer's) moves its element by a few 1e-6 after 3 steps
    assert_same_saved_weights(out1, out2, two_layer_model_dir, atol=1e-5)
    assert json.load(open(os.path.join(out2, "config.json")))["architectures"] == ["LlamaForCausalLM"]
    reloaded = LlamaForCausalLM.from_pretrained(out2)  # the plain class, one process
    np.testing.assert_allclose(reloaded.lm_head.weight.numpy(), saved_weights(out1)["lm_head.weight"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["pp2", pytest.param("tp2_pp2", marks=pytest.mark.slow)])
def test_reward_model_pp2_matches_pp1(two_layer_score_dir, tiny_data_dir, tmp_path, layout):
    """The score-model pipe (score head as last layer, pairwise loss on the last stage, pairs
    kept in one micro-batch) trains like the plain score model; evaluation scores the pairs
    through the pipeline; the merged checkpoint (normaliser statistics included) loads with
    `AutoModelForScore`."""
    from ppo.models.score_model import AutoModelForScore
    from rm.run_reward import main as run_reward

    argv = entry_argv(
        "config/tiny/rm_argument.json", two_layer_score_dir, f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl",
        f"PKU-SafeRLHF/test:0.9:{tiny_data_dir}/preference_eval.jsonl",
    )
    out1, out2 = run_plain_and_pipeline(run_reward, "rm/run_reward.py", argv, tmp_path, *LAYOUTS[layout])
    assert_same_steps(out1, out2, "rm/loss")
    # atol 1e-6: rm/margin is a difference of scores and can sit near 0 (7.9e-4 with the tiny RM's
    # schedule), where the schedules' ~1e-7 float differences exceed any relative tolerance
    for key in ("rm/accuracy", "rm/margin", "rm/eval_loss"):
        np.testing.assert_allclose(final_eval(out2, key), final_eval(out1, key), rtol=1e-4, atol=1e-6, err_msg=key)
    # atol: AdamW's first steps divide tiny gradients by their own size, so float differences
    # of the two schedules' sums (~1e-7 relative in the losses) reach ~1e-5 in some weights
    # (8e-5 in 3 of 1024 q_proj entries when the tensor-parallel slices sum them too, 1.6e-4 in
    # 1 of 2048 up_proj entries with the current tiny RM settings)
    assert_same_saved_weights(out1, out2, two_layer_score_dir, atol=5e-5 if layout == "pp2" else 3e-4)
    assert float(saved_weights(out2)["normalizer_count"][0]) == 2 * MICRO * ACCUMULATE * STEPS  # every scored row
    assert json.load(open(os.path.join(out2, "config.json")))["architectures"] == ["LlamaModelForScore"]
    reloaded = AutoModelForScore.from_pretrained(out2)
    np.testing.assert_allclose(reloaded.score_head.weight.numpy(), saved_weights(out1)["score_head.weight"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "loss_type,layout",
    [("sigmoid", "pp2"), pytest.param("kto", "pp2", marks=pytest.mark.slow), ("simpo", "pp2"), pytest.param("sigmoid", "tp2_pp2", marks=pytest.mark.slow)],
)
def test_dpo_pp2_matches_pp1(two_layer_model_dir, tiny_data_dir, tmp_path, loss_type, layout):
    """DPO (with the NLL term), KTO and SimPO (no reference) under pipeline parallel: the policy pipe's last stage
    computes the preference loss from the reference pipe's log-probs (and, for KTO, the KL
    point of both pipes' log-probs on the mismatched pairs); per-step losses and statistics,
    the evaluation and the merged weights equal the plain run's."""
    from dpo.run_dpo import main as run_dpo

    generation = f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl" if loss_type == "sigmoid" else ""
    argv = entry_argv(
        "config/tiny/dpo_argument.json", two_layer_model_dir, f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl",
        f"PKU-SafeRLHF/test:0.9:{tiny_data_dir}/preference_eval.jsonl", "--loss_type", loss_type,
        "--eval_generation_datasets", generation, "--eval_max_new_tokens", "6",
    )
    out1, out2 = run_plain_and_pipeline(run_dpo, "dpo/run_dpo.py", argv, tmp_path, *LAYOUTS[layout])
    assert_same_steps(out1, out2, "loss/total")
    for key in ("loss/dpo", "loss/sft", "rewards/accuracies", "logps/chosen"):
        v1, v2 = step_values(out1, key), step_values(out2, key)
        assert sorted(v1) == sorted(v2) == list(range(1, STEPS + 1)), key
        np.testing.assert_allclose([v2[s] for s in v1], [v1[s] for s in v1], rtol=1e-4, atol=1e-6, err_msg=key)
    for key in ("eval/loss", "eval/preference_accuracy", "eval/reward_margin"):
        np.testing.assert_allclose(final_eval(out2, key), final_eval(out1, key), rtol=1e-4, atol=1e-6, err_msg=key)
    if generation:
        assert final_eval(out2, "eval/accuracy") == final_eval(out1, "eval/accuracy")
        assert final_eval(out2, "eval/response_length") == final_eval(out1, "eval/response_length")
    assert_same_saved_weights(out1, out2, two_layer_model_dir, atol=5e-5)


def _answer_batch(vocab, rows=5, width=7, seed=0):
    rng = np.random.default_rng(seed)
    ids = paddle.to_tensor(rng.integers(4, vocab, (rows, width)), dtype="int64")
    mask = np.ones((rows, width), "int64")
    mask[1, 5:] = 0
    mask[-1, 4:] = 0
    labels = np.where(mask == 1, ids.numpy(), -100)
    labels[:, :2] = -100  # the prompt
    return {"input_ids": ids, "attention_mask": paddle.to_tensor(mask), "labels": paddle.to_tensor(labels)}


@pytest.mark.parametrize("accumulate", [1, 2, 3, 7])
def test_pipeline_eval_chunks_give_the_batch_token_mean(tiny_model_dir, accumulate):
    """The evaluation micro-batches' weighted losses, averaged as fleet's schedule does (each
    divided by the number of micro-batches, then summed), equal `answer_nll` of the whole batch,
    also with more micro-batches than rows (stand-in rows of weight 0)."""
    from ppo.models.causal_lm import answer_nll
    from ppo.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir)
    model.eval()
    batch = _answer_batch(model.config.vocab_size)
    with paddle.no_grad():
        expected = float(answer_nll(model, batch["input_ids"], batch["attention_mask"], batch["labels"], chunk_size=0)[0])
        (ids, masks, positions), labels = CausalLMPipelineInputs(accumulate)(dict(batch))
        assert len(ids) == len(labels) == accumulate
        assert masks[0].dtype == paddle.bool and positions[0].dtype == paddle.int64
        criterion = AnswerNLLCriterion()
        total = 0.0
        for i in range(accumulate):
            logits = model(input_ids=ids[i], attention_mask=masks[i], position_ids=positions[i], return_dict=True).logits
            total += float(criterion(logits, labels[i])) / accumulate
    np.testing.assert_allclose(total, expected, rtol=1e-6)


def test_pipeline_training_micro_batches_padded_alike(tiny_model_dir):
    """Training micro-batches of different widths are right-padded to the widest (mask 0,
    labels -100) and the criterion gives each one's loss unchanged."""
    from ppo.models.causal_lm import answer_nll
    from ppo.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir)
    model.eval()
    narrow, wide = _answer_batch(model.config.vocab_size, width=6, seed=1), _answer_batch(model.config.vocab_size, width=9)
    (ids, masks, positions), labels = CausalLMPipelineInputs(2)([dict(narrow), dict(wide)])
    assert [t.shape for t in ids] == [[5, 9], [5, 9]]
    np.testing.assert_array_equal(labels[0].numpy()[:, 6:], -100)
    assert not masks[0].numpy()[:, 6:].any()
    with paddle.no_grad():
        logits = model(input_ids=ids[0], attention_mask=masks[0], position_ids=positions[0], return_dict=True).logits
        got = float(AnswerNLLCriterion()(logits, labels[0]))
        expected = float(answer_nll(model, narrow["input_ids"], narrow["attention_mask"], narrow["labels"], chunk_size=0)[0])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_pipeline_refusals(tmp_path):
    from types import SimpleNamespace

    from paddlenlp.transformers import LlamaConfig, Qwen2Config

    args = SimpleNamespace(pipeline_parallel_degree=2, pipeline_parallel_config="", tensor_parallel_degree=1)
    lora, cache = pipeline_problems(args, use_lora=True)
    assert lora.startswith("use_lora with pipeline_parallel_degree 2") and "add disable_p2p_cache_shape to pipeline_parallel_config" in cache
    assert pipeline_problems(SimpleNamespace(pipeline_parallel_degree=2, pipeline_parallel_config="disable_p2p_cache_shape")) == []
    assert pipeline_problems(SimpleNamespace(pipeline_parallel_degree=1, pipeline_parallel_config=""), use_lora=True) == []
    with pytest.raises(ValueError, match="tie_word_embeddings=true"):
        pipe_classes(Qwen2Config(tie_word_embeddings=True))
    assert pipe_classes(Qwen2Config(tie_word_embeddings=False))[1] == "Qwen2ForCausalLM"
    assert pipe_classes(LlamaConfig())[0].__name__ == "LlamaForCausalLMPipe"
    with pytest.raises(ValueError, match="no pipeline class for model_type 'gpt'"):
        pipe_classes(SimpleNamespace(model_type="gpt"))


@pytest.mark.parametrize("loss_type", ["sequence-wise", "token-wise"])
def test_pairwise_criterion_equals_plain_reward_loss(tiny_rm_dir, loss_type):
    """The last stage's RM loss on the pipe's raw scores equals `reward_loss` of the plain score
    model in training mode, normaliser included (statistics updated from each batch's end
    scores, scores normalised with them), over two batches; training micro-batches stack each
    one's pairs (better rows first), right-padded to the widest."""
    import copy

    from ppo.models.score_model import AutoModelForScore
    from ppo.strategy.pipeline.score_pipe import PairwiseRewardCriterion, PreferencePipelineInputs, ScoreHeadPipe
    from rm.reward_trainer import reward_loss

    settings = dict(do_normalize=True, normalizer_type="RunningMeanStd")
    plain = AutoModelForScore.from_pretrained(tiny_rm_dir, **settings)
    raw = AutoModelForScore.from_pretrained(tiny_rm_dir)  # same weights, no normaliser: the pipe's scores
    plain.train()
    head = ScoreHeadPipe(copy.deepcopy(plain.config))
    head.train()
    criterion = PairwiseRewardCriterion(loss_type, 0.01, head)
    vocab = plain.config.vocab_size
    batches = []
    for seed, width in ((0, 7), (1, 5)):
        better, worse = _answer_batch(vocab, 3, width, seed), _answer_batch(vocab, 3, width, seed + 10)
        worse["input_ids"][:, :2] = better["input_ids"][:, :2]  # a shared prompt
        batches.append({f"{side}_{k}": v[k] for side, v in (("better", better), ("worse", worse)) for k in ("input_ids", "attention_mask")})
    (ids, masks, positions), labels = PreferencePipelineInputs(2)([dict(b) for b in batches])
    assert [t.shape for t in ids] == [[6, 7], [6, 7]]
    np.testing.assert_array_equal(ids[1].numpy()[:3, :5], batches[1]["better_input_ids"].numpy())
    np.testing.assert_array_equal(ids[1].numpy()[3:, :5], batches[1]["worse_input_ids"].numpy())
    for batch, micro_ids, mask, pos, label in zip(batches, ids, masks, positions, labels):
        expected = float(reward_loss(plain, batch, loss_type, 0.01)[0])
        scores = raw(micro_ids, attention_mask=mask.astype("int64"), position_ids=pos).scores
        np.testing.assert_allclose(float(criterion(scores, label)), expected, rtol=1e-5)
    for name in ("normalizer_mean", "normalizer_var", "normalizer_count"):
        np.testing.assert_allclose(getattr(head, name).numpy(), getattr(plain, name).numpy(), rtol=1e-5, err_msg=name)
    assert float(head.normalizer_count) == 12.0


@pytest.mark.parametrize("pairs,accumulate", [(5, 2), (2, 3), (1, 1)])
def test_preference_evaluation_groups_round_trip(pairs, accumulate):
    """A preference batch cut into the schedule's micro-batches (each its pairs stacked, chosen
    rows first; a group without pairs repeats pair 0) and put back by `ungroup` gives the batch's
    `[2B]` order: chosen rows of pairs 0..B-1, then their rejected rows; KTO's mismatched rows
    (`kl_*`) go through the same cut."""
    from ppo.strategy.pipeline.preference_pipe import PAIR_KEYS, PreferencePolicyInputs, kl_sides

    rng = np.random.default_rng(pairs)
    batch = {f"{side}_{key}": paddle.to_tensor(rng.integers(0, 50, (pairs, 4))) for side in ("better", "worse") for key in PAIR_KEYS}
    batch["kl_input_ids"] = paddle.concat([batch["better_input_ids"] + 100, batch["worse_input_ids"] + 100])
    batch["kl_attention_mask"] = batch["kl_labels"] = batch["kl_input_ids"]
    prepare = PreferencePolicyInputs(accumulate)
    micro, groups = prepare.evaluation_groups(batch)
    assert len(micro) == accumulate and sorted(sum(groups, [])) == list(range(pairs))
    for part, group in zip(micro, groups):
        rows = max(len(group), 1)
        assert part["labels"].shape == [2 * rows, 4]
        np.testing.assert_array_equal(part["input_ids"].numpy()[:rows], batch["better_input_ids"].numpy()[group or [0]])
    first_token = [m["input_ids"][:, 0] for m in micro]
    expected = np.concatenate([batch["better_input_ids"].numpy()[:, 0], batch["worse_input_ids"].numpy()[:, 0]])
    np.testing.assert_array_equal(prepare.ungroup(groups, first_token).numpy(), expected)
    kl_micro, kl_groups = prepare.evaluation_groups(kl_sides(batch), "kl_")
    np.testing.assert_array_equal(prepare.ungroup(kl_groups, [m["input_ids"][:, 0] for m in kl_micro]).numpy(), expected + 100)
