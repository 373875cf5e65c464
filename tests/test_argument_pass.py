"""The arguments are checked in one pass, not a `__post_init__` chain: every entry point's argument
classes have one `__post_init__` of ours (`resolve_arguments`), which runs each group's own
`resolve_group` once, bases first, PaddleNLP's `TrainingArguments.__post_init__` as the first
group; a group's checks run wherever it is used (online DPO's data arguments included)."""
import pytest

from ppo.common.argument_problems import ArgumentError, resolve_arguments
from ppo.common.argument_table import import_classes
from ppo.common.entry_points import ENTRY_POINTS

ENTRY_CLASSES = [(e.command, cls) for e in ENTRY_POINTS if e.arguments for cls in import_classes(e)]


@pytest.mark.parametrize("command, cls", ENTRY_CLASSES, ids=[f"{c}-{k.__name__}" for c, k in ENTRY_CLASSES])
def test_one_post_init_per_argument_class(command, cls):
    ours = [c for c in cls.__mro__ if "__post_init__" in vars(c) and not c.__module__.startswith("paddlenlp")]
    assert all(vars(c)["__post_init__"] is resolve_arguments for c in ours), [c.__qualname__ for c in ours]


def test_groups_run_once_base_first_with_paddlenlp_first():
    from ppo.entry.ppo_arguments import PPOTrainingArguments

    order = [c.__name__ for c in reversed(PPOTrainingArguments.__mro__) if "resolve_group" in vars(c)]
    assert order[0] == "PaddleNLPTrainingArguments" and order[-1] == "PPOTrainingArguments"
    assert len(order) == len(set(order)) >= 7
    args = PPOTrainingArguments(output_dir="/tmp/unused_argument_pass")
    assert args.per_device_prompt_batch_size == 16 and args.normalize_advantage is True  # filled by PPO's group


def test_every_problem_of_every_group_in_one_error():
    from ppo.entry.ppo_arguments import PPOTrainingArguments

    with pytest.raises(ArgumentError) as err:
        PPOTrainingArguments(output_dir="/tmp/unused_argument_pass", logprob_chunk_size=-1, rollout_kernels="x",
                             max_turns=0, clip_range_ratio=0.0, eval_num_samples=-1)
    assert str(err.value).splitlines()[1:] == [
        "  logprob_chunk_size must be >= 0 (0 = full logits), got -1",
        "  rollout_kernels must be one of ('auto', 'custom', 'paddle'), got 'x'",
        "  max_turns must be >= 1, got 0",
        "  eval_num_samples must be >= 0 (0: greedy evaluation only), got -1",
        "  clip_range_ratio=0.0 (must be > 0)",
    ]


def test_online_dpo_data_arguments_check_the_chat_template(tmp_path):
    """Online DPO's data arguments ran their own check only (no `super().__post_init__()`), so a
    chat template file that does not exist passed; the dataset group's check runs now."""
    from dpo.online_dpo_arguments import DataArgument

    missing = str(tmp_path / "nope.json")
    with pytest.raises(ArgumentError, match=f"chat_template: {missing} does not exist"):
        DataArgument(chat_template=missing)
