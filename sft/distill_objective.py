"""The distillation objective: the teacher's view of a batch and the student's generalised JSD.

`TeacherScorer` runs the teacher (no gradients, eval mode) over the batch's tokens and hands the
student's loss either its final hidden states and LM head (the full distribution, recomputed
per chunk) or, with `top_k > 0`, its top-k distribution at the counted positions only
(`ppo.algos.teacher_top_k_from_hidden`), plus its log-prob of every counted token.
`student_token_gjsd` runs the student through its wrappers (LoRA, DataParallel) with the LM head
replaced by `ppo.algos.gjsd_from_hidden`, so the head runs only over the counted positions in
chunks and data-parallel reducers see the head in the graph (as `ppo.models.causal_lm` does for
log-probs).
"""
import logging

import paddle

from ppo.algos import TeacherHead, gjsd_from_hidden, teacher_top_k_from_hidden, token_logprobs_from_hidden
from ppo.models.causal_lm import final_hidden_states, lm_head_replaced, lm_head_weight, position_ids_from_mask

logger = logging.getLogger(__name__)
NOT_COUNTED = -100


def shifted_labels(labels):
    """`labels [N, T]` moved one column left (the output at t scores token t + 1), the last
    column not counted: `[N, T]`."""
    pad = paddle.full([labels.shape[0], 1], NOT_COUNTED, dtype=labels.dtype)
    return paddle.concat([labels[:, 1:], pad], axis=1)


def head_of(model, role):
    """`(weight, transpose_y)` of the LM head of `model`, or ValueError naming `role` and why the
    head cannot be evaluated from hidden states (a bias, a vocabulary split across ranks)."""
    weight, detail = lm_head_weight(model)
    if weight is None:
        raise ValueError(f"distillation evaluates the {role}'s LM head from hidden states, and here it cannot: {detail}")
    return weight, detail


class TeacherScorer:
    """The teacher's side of the loss (see the module docstring). `temperature` divides its
    logits (as the student's); `chunk_size` positions go through its head at a time."""

    def __init__(self, model, top_k=0, temperature=1.0, chunk_size=512):
        self.model = model
        self.model.eval()
        for p in self.model.parameters():
            p.stop_gradient = True
        self.weight, self.transpose_y = head_of(model, "teacher")
        self.vocab_size = int(self.weight.shape[0 if self.transpose_y else 1])
        if top_k >= self.vocab_size:
            logger.warning(f"teacher_top_k={top_k} keeps every one of the {self.vocab_size} tokens: the full distribution")
            top_k = 0
        self.top_k, self.temperature, self.chunk_size = int(top_k), float(temperature), int(chunk_size)

    def __call__(self, input_ids, attention_mask, labels):
        """`(teacher, label_logprobs [N, T])` for `gjsd_from_hidden`; `labels` already shifted."""
        with paddle.no_grad():
            hidden = final_hidden_states(self.model, input_ids, attention_mask)
            if self.top_k:
                return teacher_top_k_from_hidden(hidden, self.weight, labels, None, self.top_k, self.temperature,
                                                 self.chunk_size, self.transpose_y)
            label_logp, _ = token_logprobs_from_hidden(hidden, self.weight, labels, None, self.temperature,
                                                       self.chunk_size, self.transpose_y)
        return TeacherHead(hidden, self.weight, self.transpose_y), label_logp


def student_token_gjsd(model, input_ids, attention_mask, labels, teacher, beta, temperature, chunk_size):
    """Per-token generalised JSD `[N, T]` of the student `model` against `teacher` (a
    `TeacherHead` or `TeacherTopK` for the same `labels`, already shifted), 0 where not counted,
    with gradients to the student's weights."""
    weight, transpose_y = head_of(model, "student")

    def head_fn(hidden):  # [N, T, H] -> [N, T, 1]
        return gjsd_from_hidden(hidden, weight, labels, None, teacher, beta, temperature, chunk_size,
                                transpose_y).unsqueeze(-1)

    with lm_head_replaced(model, head_fn):
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids_from_mask(attention_mask), return_dict=True)
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[:, :, 0]
