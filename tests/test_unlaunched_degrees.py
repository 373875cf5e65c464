"""A parallel degree > 1 in a process that was not launched with others runs at 1 (PaddleNLP's
arguments reset it): the run says so in one line instead of ignoring the setting silently."""
import logging

from ppo.common.argument_parsing import parse_arguments
from ppo.common.training_world import unlaunched_degree_notes
from sft import sft_arguments

SFT_CLASSES = (sft_arguments.ModelArgument, sft_arguments.DataArgument, sft_arguments.SFTTrainingArguments)


def test_each_degree_above_one_gets_one_line_naming_it_when_not_launched():
    notes = unlaunched_degree_notes({"tensor_parallel_degree": 2, "pipeline_parallel_degree": "4",
                                     "sharding_parallel_degree": 1, "learning_rate": 3}, world_size=1)
    assert notes == [
        "tensor_parallel_degree 2 runs at 1 in this single process: launch "
        "`python -m paddle.distributed.launch --nproc_per_node N ...` to run it at 2",
        "pipeline_parallel_degree 4 runs at 1 in this single process: launch "
        "`python -m paddle.distributed.launch --nproc_per_node N ...` to run it at 4"]


def test_a_launched_process_gets_no_note(monkeypatch):
    assert unlaunched_degree_notes({"tensor_parallel_degree": 2}, world_size=2) == []
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    assert unlaunched_degree_notes({"tensor_parallel_degree": 2}) == []
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "1")
    assert len(unlaunched_degree_notes({"tensor_parallel_degree": 2})) == 1


def test_the_argument_parse_logs_the_note_for_a_file_degree(tmp_path, monkeypatch):
    monkeypatch.delenv("PADDLE_TRAINERS_NUM", raising=False)
    path = tmp_path / "sft.json"
    path.write_text('{"model_name_or_path": "m", "output_dir": "%s", "tensor_parallel_degree": 2}' % tmp_path)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("ppo").addHandler(handler)
    try:
        args = parse_arguments(SFT_CLASSES, [str(path)])[2]
    finally:
        logging.getLogger("ppo").removeHandler(handler)
    assert args.tensor_parallel_degree in (-1, 1)
    assert [m for m in seen if "single process" in m] == [
        "tensor_parallel_degree 2 runs at 1 in this single process: launch "
        "`python -m paddle.distributed.launch --nproc_per_node N ...` to run it at 2"]
