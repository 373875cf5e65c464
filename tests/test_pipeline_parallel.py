"""Pipeline parallelism on CPU processes: PaddleNLP's `LlamaForCausalLMPipe` at pp_degree 2 (two
processes, the 1F1B schedule of fleet's `PipelineParallel`, with the two stand-ins of
`tests/tp_cpu_collectives.install_pipeline`) trains like the plain `LlamaForCausalLM` in one
process from the same checkpoint: the same loss at every step and the same weights after
them."""
import glob
import json
import os

import numpy as np
import paddle
from paddlenlp.transformers import LlamaForCausalLM
from paddlenlp.transformers.llama.modeling import LlamaPretrainingCriterion

from pp_worker import ACCUMULATE, MICRO, pipeline_batch
from tp_launch import launch_run

STEPS, LR = 2, 0.05


def reference_run(model_dir):
    """The same SGD steps on the plain model: micro-batch losses averaged, as the schedule does."""
    paddle.seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    criterion = LlamaPretrainingCriterion(model.config)
    opt = paddle.optimizer.SGD(learning_rate=LR, parameters=model.parameters())
    ids, labels = pipeline_batch(model.config.vocab_size)
    losses = []
    for _ in range(STEPS):
        total = 0.0
        for m in range(ACCUMULATE):
            rows = slice(m * MICRO, (m + 1) * MICRO)
            logits = model(paddle.to_tensor(ids[rows]), return_dict=True).logits
            loss = criterion(logits, paddle.to_tensor(labels[rows])) / ACCUMULATE
            loss.backward()
            total += float(loss)
        opt.step()
        opt.clear_grad()
        losses.append(total)
    return losses, {n: p.numpy() for n, p in model.named_parameters()}


def test_pp2_training_matches_one_process(tiny_model_dir, tmp_path):
    out = str(tmp_path / "pp2")
    launch_run("tests/pp_worker.py", [tiny_model_dir, out, str(STEPS), str(LR)], out)
    pp_losses = json.load(open(os.path.join(out, "losses.json")))
    stages = [dict(np.load(f)) for f in sorted(glob.glob(os.path.join(out, "stage*.npz")))]
    assert len(stages) == 2 and stages[0] and stages[1]
    assert not set(stages[0]) & set(stages[1])  # each stage holds its own layers
    merged = {**stages[0], **stages[1]}
    ref_losses, ref_weights = reference_run(tiny_model_dir)
    assert set(merged) == set(ref_weights)
    np.testing.assert_allclose(pp_losses, ref_losses, rtol=1e-5)
    assert pp_losses[1] < pp_losses[0]  # the first step trained
    for name, value in ref_weights.items():
        np.testing.assert_allclose(merged[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
