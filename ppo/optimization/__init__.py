"""The optimiser and its memory: fused AdamW (`optim`) and PaddleNLP's `offload_level`
(`offload`)."""
