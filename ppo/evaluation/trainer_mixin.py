"""Held-out generation evaluation inside PaddleNLP `Trainer` subclasses (SFT, DPO): the model
to generate with comes from the run's layout (`ppo.strategy`), the rest is
`ppo.evaluation.generation.evaluate_generation`."""
import json
import os

from ..common.parallel_groups import model_parallel_group
from ..strategy import build_strategy
from .generation import LONG_ANSWER_LEN, evaluate_generation


class GenerationEvalMixin:
    """For PaddleNLP `Trainer` subclasses: greedy exact-match evaluation on
    `eval_prompt_dataset` (a `PromptOnlyDataset` with reference answers), with the
    answers written to `output_dir/eval_samples.jsonl` by the main process."""

    def setup_generation_eval(self, eval_prompt_dataset=None, eval_max_new_tokens=16, eval_long_answer_len=LONG_ANSWER_LEN, use_rollout_engine=True):
        self.eval_prompt_dataset = eval_prompt_dataset
        self.eval_max_new_tokens = eval_max_new_tokens
        self.eval_long_answer_len = eval_long_answer_len
        self.use_rollout_engine = use_rollout_engine

    def generation_weights(self):
        """Context giving the model to generate with (`Strategy.generation_copy`): the trained
        model, or under pipeline parallelism a plain copy on every rank filled with all its
        stages for the block and released after it."""
        if getattr(self, "_generation_layout", None) is None:
            self._generation_layout = build_strategy(self.args)
        return self._generation_layout.generation_copy(self.model)

    def generation_metrics(self):
        """`eval/accuracy`, `eval/accuracy_long`, `eval/accuracy_short`, `eval/response_length`; {} without prompts."""
        if self.eval_prompt_dataset is None:
            return {}
        with self.generation_weights() as model:
            metrics, records = evaluate_generation(
                model,
                self.tokenizer,
                self.eval_prompt_dataset,
                batch_size=self.args.per_device_eval_batch_size,
                max_new_tokens=self.eval_max_new_tokens,
                use_rollout_engine=self.use_rollout_engine,
                long_answer_len=self.eval_long_answer_len,
                tensor_parallel_group=model_parallel_group(),
            )
        if self.is_world_process_zero():
            os.makedirs(self.args.output_dir, exist_ok=True)
            with open(os.path.join(self.args.output_dir, "eval_samples.jsonl"), "w") as f:
                for r in records:
                    f.write(json.dumps(r) + "\n")
        return metrics
