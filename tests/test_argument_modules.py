"""Argument modules: each entry point's dataclasses in a module of its own, a shared field
declared once (an entry point's own default through `default_override`), the KL estimator names
in one place, and `max_prompt_len` meaning one thing."""
import dataclasses

import pytest

from dpo import dpo_arguments, online_dpo_arguments
from ppo.entry import ppo_arguments
from ppo.entry import argument_groups
from ppo.common.argument_parsing import ArgumentError, parse_arguments
from rm import audit_arguments, reward_arguments
from sft import distill_arguments, sft_arguments

ENTRY_CLASSES = {
    "sft": (sft_arguments.ModelArgument, sft_arguments.DataArgument, sft_arguments.SFTTrainingArguments),
    "rm": (reward_arguments.ModelArgument, reward_arguments.DataArgument, reward_arguments.RewardTrainingArguments),
    "ppo": (ppo_arguments.ModelArgument, ppo_arguments.DataArgument, ppo_arguments.PPOTrainingArguments),
    "dpo": (dpo_arguments.ModelArgument, dpo_arguments.DataArgument, dpo_arguments.DPOTrainingArguments),
    "online_dpo": (online_dpo_arguments.ModelArgument, online_dpo_arguments.DataArgument,
                   online_dpo_arguments.OnlineDPOTrainingArguments),
    "audit": (audit_arguments.AuditArgument,),
    "distill": (distill_arguments.ModelArgument, distill_arguments.DataArgument,
                distill_arguments.DistillTrainingArguments),
}


def declaring_classes(name):
    """`{class path: help}` of every class of ours (in any entry point's hierarchy) whose own body
    declares field `name`."""
    found = {}
    for classes in ENTRY_CLASSES.values():
        for cls in classes:
            for klass in cls.__mro__:
                if klass.__module__.startswith(("ppo.", "sft.", "rm.", "dpo.")) and name in klass.__dict__.get("__annotations__", {}):
                    found[f"{klass.__module__}.{klass.__qualname__}"] = klass.__dataclass_fields__[name].metadata["help"]
    return found


ROLLOUT_FIELDS = [f.name for f in dataclasses.fields(argument_groups.RolloutArguments)]
LOOP_FIELDS = list(argument_groups.OnlineRolloutArguments.__annotations__)  # the loop's own fields


@pytest.mark.parametrize("name", ["use_fusemt", "eval_max_new_tokens", "eval_with_do_generation", "use_lora", "max_length",
                                  "divergence_window", "logprob_chunk_size", "stop_on_divergence", *ROLLOUT_FIELDS,
                                  *LOOP_FIELDS])
def test_shared_fields_are_declared_once(name):
    """One declaration, in a shared group; an entry point with its own default redeclares the
    field with `default_override`, which keeps the group's help word for word."""
    found = declaring_classes(name)
    groups = [path for path in found if path.startswith("ppo.entry.argument_groups.")]
    # the online loops' own default (True), once for PPO/GRPO and online DPO, by `default_override`
    overrides = {"stop_on_divergence": ["ppo.entry.argument_groups.OnlineRolloutArguments"]}.get(name, [])
    assert len(set(groups) - set(overrides)) == 1 and set(overrides) <= set(groups), found
    assert len(set(found.values())) == 1, found


def test_ppo_and_online_dpo_share_the_rollout_fields_and_keep_their_defaults(tmp_path):
    """The fields online DPO declared a second time are the shared groups' now: same names,
    same defaults, except `rollout_n` (PPO 1; online DPO 4, a pair needs two answers)."""
    assert {"per_device_prompt_batch_size", "rollout_n", "max_dec_len", "temperature", "top_p", "top_k",
            "repetition_penalty", "missing_eos_penalty", "update_iters", "use_fused_adamw"} <= set(ROLLOUT_FIELDS + LOOP_FIELDS)
    out = ["--output_dir", str(tmp_path), "--max_steps", "1"]
    ppo = parse_arguments(ENTRY_CLASSES["ppo"], out)[2]
    online = parse_arguments(ENTRY_CLASSES["online_dpo"], out)[2]
    differing = {n: (getattr(ppo, n), getattr(online, n)) for n in ROLLOUT_FIELDS + LOOP_FIELDS if getattr(ppo, n) != getattr(online, n)}
    assert differing == {"rollout_n": (1, 4)}
    assert parse_arguments(ENTRY_CLASSES["online_dpo"], [*out, "--rollout_n", "6", "--top_k", "5"])[2].top_k == 5
    with pytest.raises(ArgumentError, match="rollout_n must be >= 2"):
        parse_arguments(ENTRY_CLASSES["online_dpo"], [*out, "--rollout_n", "1"])


def test_entry_points_read_their_classes_from_the_argument_modules():
    import dpo.run_dpo
    import rm.audit_reward
    import rm.run_reward
    import sft.run_sft

    assert sft.run_sft.SFTTrainingArguments is sft_arguments.SFTTrainingArguments
    assert rm.run_reward.RewardTrainingArguments is reward_arguments.RewardTrainingArguments
    assert dpo.run_dpo.DPOTrainingArguments is dpo_arguments.DPOTrainingArguments
    assert rm.audit_reward.AuditArgument is audit_arguments.AuditArgument
    for module in (sft_arguments, reward_arguments, dpo_arguments, ppo_arguments, audit_arguments):
        assert callable(module.validate_arguments)


def test_the_kl_estimator_names_have_one_home():
    import paddle

    import ppo.trainer.advantages
    import ppo.trainer.updater
    from ppo.algos import kl

    assert ppo_arguments.KL_ESTIMATOR_NAMES is kl.KL_ESTIMATOR_NAMES
    assert ppo.trainer.updater.K3_NAMES is kl.K3_NAMES and ppo.trainer.advantages.K3_NAMES is kl.K3_NAMES
    assert set(kl.KL_ESTIMATOR_NAMES) == {"k1", "k2", "k3", "kl", "mse", "low_var_kl"} and set(kl.K3_NAMES) == {"k3", "low_var_kl"}
    logp, ref = paddle.to_tensor([[-1.0, -2.0]]), paddle.to_tensor([[-1.5, -1.0]])
    for name in kl.KL_ESTIMATOR_NAMES:  # every listed name is one kl_penalty computes
        kl.kl_penalty(logp, ref, name, clamp=1.0 if name in kl.K3_NAMES else None)


def test_kl_estimator_outside_the_list_is_refused_with_the_list(tmp_path):
    with pytest.raises(ArgumentError, match=r"kl_loss_type must be one of \('k1', 'kl', 'k2', 'mse', 'k3', 'low_var_kl'\), got 'k4'"):
        parse_arguments(ENTRY_CLASSES["ppo"], ["--output_dir", str(tmp_path), "--kl_loss_type", "k4"])


def test_max_prompt_len_drops_and_truncate_prompt_len_truncates(tmp_path):
    """PPO/GRPO and the audit keep `max_prompt_len` (drop long prompts); SFT and the DPO family
    truncate with `truncate_prompt_len`, to which PaddleNLP's `src_length` and DPO
    `max_prompt_len` keys map."""
    out = ["--output_dir", str(tmp_path)]
    _, ppo_data, _ = parse_arguments(ENTRY_CLASSES["ppo"], [*out, "--max_prompt_len", "40"])
    assert ppo_data.max_prompt_len == 40 and not hasattr(ppo_data, "truncate_prompt_len")
    for entry in ("sft", "dpo"):
        for key in ("max_prompt_len", "src_length", "truncate_prompt_len"):
            _, data, _ = parse_arguments(ENTRY_CLASSES[entry], [*out, f"--{key}", "24"])
            assert data.truncate_prompt_len == 24 and not hasattr(data, "max_prompt_len"), (entry, key)
    with pytest.raises(ArgumentError, match="command line: unknown argument 'truncate_prompt_len'; did you mean 'max_prompt_len'"):
        parse_arguments(ENTRY_CLASSES["ppo"], [*out, "--truncate_prompt_len", "24"])
    fields = {f.name: f for f in dataclasses.fields(argument_groups.PromptTruncationArguments)}
    assert "keep their last ones" in fields["truncate_prompt_len"].metadata["help"]
    assert "dropped, not truncated" in {f.name: f for f in dataclasses.fields(ppo_arguments.DataArgument)}["max_prompt_len"].metadata["help"]


def test_eval_max_new_tokens_zero_means_the_entry_point_default(tmp_path):
    _, _, sft = parse_arguments(ENTRY_CLASSES["sft"], ["--output_dir", str(tmp_path)])
    _, _, sft_set = parse_arguments(ENTRY_CLASSES["sft"], ["--output_dir", str(tmp_path), "--eval_max_new_tokens", "7"])
    assert sft.eval_new_tokens() == argument_groups.DEFAULT_EVAL_MAX_NEW_TOKENS == 32 and sft_set.eval_new_tokens() == 7
    _, _, ppo = parse_arguments(ENTRY_CLASSES["ppo"], ["--output_dir", str(tmp_path), "--max_dec_len", "9"])
    assert ppo.eval_max_new_tokens == 0 and ppo.eval_new_tokens(ppo.max_dec_len) == 9


def test_eval_mode_is_checked_with_the_other_arguments_and_the_engine_takes_a_flag(tmp_path):
    """`eval_mode` is refused in the start-up pass, in the same error as the other problems; the
    rollout engine takes the resulting `keep_tensor_parallel` flag and has no check of its own."""
    import inspect

    from ppo.rollout import RolloutEngine

    with pytest.raises(ArgumentError) as info:
        parse_arguments(ENTRY_CLASSES["ppo"], ["--output_dir", str(tmp_path), "--eval_mode", "pipeline",
                                               "--kl_loss_type", "k4"])
    lines = str(info.value).splitlines()
    assert lines[0].startswith("2 arguments cannot be used"), lines
    assert "  eval_mode must be one of ('', 'single', 'tensor_parallel'), got 'pipeline'" in lines
    assert any("kl_loss_type must be one of" in line for line in lines)
    layouts = {mode: parse_arguments(ENTRY_CLASSES["ppo"], ["--output_dir", str(tmp_path), "--eval_mode", mode])[2]
               for mode in ("", "single", "tensor_parallel")}
    assert {mode: args.keep_tensor_parallel for mode, args in layouts.items()} == {"": False, "single": False, "tensor_parallel": True}
    parameters = inspect.signature(RolloutEngine).parameters
    assert "eval_mode" not in parameters and parameters["keep_tensor_parallel"].default is False


def test_the_paddlenlp_key_table_names_each_renamed_key_s_target():
    """docs/paddlenlp.md's renamed-keys table agrees with `paddlenlp_keys.RENAMED`: `src_length`
    and DPO's `max_prompt_len` are read as `truncate_prompt_len` (PPO/GRPO keep `max_prompt_len`)."""
    import os

    from ppo.common import paddlenlp_keys as pk

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = [line.split("|")[1:3] for line in open(os.path.join(root, "docs", "paddlenlp.md"), encoding="utf-8")
            if line.startswith("| `")]
    for key, (target, *_) in pk.RENAMED.items():
        assert any(f"`{key}`" in theirs and f"`{target}`" in ours for theirs, ours in rows), (key, target)
    assert pk.RENAMED["src_length"][0] == pk.RENAMED["max_prompt_len"][0] == "truncate_prompt_len"
