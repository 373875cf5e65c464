"""A generative judge: a causal LM scores answers by the probability of a verdict token.

`GenerativeJudge.score` renders one rubric prompt per item (``ppo.judge.templates``), runs the
prompts through the rollout engine's prefill only (``ppo.rollout.prefill.prefill_logits``: one
pass, the next token's logits), and turns those logits into a score in [0, 1] with
``ppo.algos.judge_scores``: ``P(yes) / (P(yes) + P(no))``, or the expected score over score tokens
scaled to [0, 1]. `GenerativeJudge.compare` is the pairwise mode: ``P(A better)`` from the "A"/"B"
verdict, asked in both orders and averaged so that the judge's preference for a position cancels.

The judge holds no state that changes its answers; calls are serialised by a lock (one engine,
one set of buffers), so threads of the reward server may share it.
"""
import threading

import paddle

from ..algos.judge_scores import expected_score, order_averaged_preference, verdict_probability
from ..data.collate import left_padding
from ..data.encode import encode_text
from .templates import VERDICTS, check_template, first_token_ids, render, single_token_ids, template_text


class GenerativeJudge:
    """`model` (a causal LM, LoRA or not) and its `tokenizer` as a judge.

    `template` / `pair_template`: pointwise and pairwise rubric templates (names or texts);
    `verdict`: "yes_no" (`yes`, `no` words) or "score" (`scores`: words, each one token, valued
    1, 2, ... in order); `pair_words`: the pairwise verdicts for the first and the second answer;
    `batch_size`: prompts per prefill; `max_prompt_len`: longer prompts are refused (0: no limit);
    `use_rollout_engine`: False runs plain forwards instead of the engine's prefill.
    """

    def __init__(self, model, tokenizer, template="correct", pair_template="better", verdict="yes_no", yes="Yes",
                 no="No", scores=tuple(str(i) for i in range(1, 11)), pair_words=("A", "B"), batch_size=64,
                 max_prompt_len=0, use_rollout_engine=True):
        from ..rollout import RolloutEngine

        if verdict not in VERDICTS:
            raise ValueError(f"judge verdict must be one of {VERDICTS}, got {verdict!r}")
        self.tokenizer, self.verdict = tokenizer, verdict
        self.template, self.pair_template = template_text(template), template_text(pair_template)
        check_template(self.template, pairwise=False)
        check_template(self.pair_template, pairwise=True)
        self.yes_no_ids = first_token_ids(tokenizer, [yes, no])
        self.score_ids = single_token_ids(tokenizer, list(scores)) if verdict == "score" else None
        self.pair_ids = first_token_ids(tokenizer, list(pair_words))
        self.batch_size, self.max_prompt_len = int(batch_size), int(max_prompt_len)
        self.engine = RolloutEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                    use_rollout_engine=use_rollout_engine)
        self.lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        """The judge of the model directory (or LoRA adapter) `path`, in eval mode."""
        from ..models.loading import load_causal_lm, load_tokenizer

        model = load_causal_lm(path)
        model.eval()
        return cls(model, load_tokenizer(path), **kwargs)

    def next_token_logits(self, texts):
        """Logits `[N, V]` of the token after each prompt text, `batch_size` prompts per prefill."""
        encoded = [encode_text(self.tokenizer, t) for t in texts]
        too_long = [i for i, e in enumerate(encoded) if self.max_prompt_len and len(e) > self.max_prompt_len]
        if too_long:
            raise ValueError(f"judge prompts {too_long[:5]} have more than max_prompt_len={self.max_prompt_len} tokens")
        from ..rollout.prefill import prefill_logits

        parts = []
        with self.lock:
            for s in range(0, len(encoded), self.batch_size):
                rows = encoded[s : s + self.batch_size]
                ids = paddle.to_tensor(left_padding(rows, self.tokenizer.pad_token_id))
                mask = paddle.to_tensor(left_padding([[1] * len(r) for r in rows], 0))
                parts.append(prefill_logits(self.engine, ids, mask))
        return paddle.concat(parts) if parts else paddle.zeros([0, 1], "float32")

    def _verdict_scores(self, logits):
        if self.verdict == "score":
            return expected_score(logits, self.score_ids, list(range(1, len(self.score_ids) + 1)))
        return verdict_probability(logits, *self.yes_no_ids)

    def score(self, questions, answers, references=None):
        """Score in [0, 1] of each answer to its question (see the module docstring)."""
        references = [None] * len(questions) if references is None else list(references)
        if not len(questions) == len(answers) == len(references):
            raise ValueError(f"{len(questions)} questions, {len(answers)} answers, {len(references)} references")
        if not questions:
            return []
        texts = [render(self.template, question=q, answer=a, reference=r)
                 for q, a, r in zip(questions, answers, references)]
        return self._verdict_scores(self.next_token_logits(texts)).numpy().tolist()

    def compare(self, questions, answers_a, answers_b, references=None):
        """P(answer A is better than answer B) per item, both orders averaged
        (`order_averaged_preference`). Online DPO can rank two samples with it."""
        n = len(questions)
        references = [None] * n if references is None else list(references)
        if not n == len(answers_a) == len(answers_b) == len(references):
            raise ValueError(f"{n} questions, {len(answers_a)} and {len(answers_b)} answers, {len(references)} references")
        if not n:
            return []
        first = [render(self.pair_template, question=q, answer_a=a, answer_b=b, reference=r)
                 for q, a, b, r in zip(questions, answers_a, answers_b, references)]
        swapped = [render(self.pair_template, question=q, answer_a=b, answer_b=a, reference=r)
                   for q, a, b, r in zip(questions, answers_a, answers_b, references)]
        p = verdict_probability(self.next_token_logits(first + swapped), *self.pair_ids)
        return order_averaged_preference(p[:n], p[n:]).numpy().tolist()
