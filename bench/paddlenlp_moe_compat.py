"""PaddleNLP 3.0.0b4's Qwen2-MoE and Mixtral forwards, mended to run under Paddle 3.3.1.

`bench/rollout_bench.py` measures the rollout engine against PaddleNLP's own `generate` on these
families. As shipped, both forwards stop under Paddle 3.3.1:

- Qwen2-MoE (`paddlenlp.transformers.moe_gate.PretrainedMoEGate._priority`): ``cumsum`` of an
  int32 one-hot mask returns int64, and multiplying it by the int32 mask is refused ("Type
  promotion only support calculations between floating-point numbers").
- Mixtral (`MixtralSparseMoeBlock.forward`): ``routing_weights[top_x, idx]`` is ``[n]`` under
  Paddle 3's indexing, where the code expects ``[n, 1]`` to scale the expert output ``[n, H]``.

`apply()` replaces the two methods with copies that differ only where they stop: the mask is
int64 before the cumulative sum, and the routing weight gets its trailing axis (a single routed
token keeps its row axis too). Nothing else of PaddleNLP's computation changes, so the baseline
stays PaddleNLP's: dense one-hot dispatch for Qwen2-MoE (`drop_tokens=False`, so no token is
dropped) and a per-expert loop for Mixtral. `tests/test_paddlenlp_moe_compat.py` checks the mended
forwards against our classes of the same checkpoints.

PaddleNLP's Qwen2-MoE puts the sparse block on every layer (it reads neither
``decoder_sparse_step`` nor ``mlp_only_layers``), so the bench's Qwen2-MoE has experts on every
layer. Generation needs ``use_cache=True``, ``output_router_logits=False`` (its auxiliary loss
fails on an empty tuple of router logits) and a 2-D attention mask: `GENERATE_KWARGS`.
"""
import paddle
import paddle.nn.functional as F

GENERATE_KWARGS = dict(use_cache=True, output_router_logits=False)


def _priority(self, topk_idx, capacity):
    """`PretrainedMoEGate._priority` with the one-hot mask in int64: ``[S, k]`` expert ids ->
    ``[S, E, capacity]`` int32 dispatch mask (a token's slot in each expert's buffer)."""
    expert_index = paddle.transpose(topk_idx, [1, 0]).reshape([-1])
    expert_mask = F.one_hot(expert_index, self.num_experts).cast(paddle.int64)
    token_priority = paddle.cumsum(expert_mask, axis=0) * expert_mask - 1
    token_priority = token_priority.reshape((self.top_k, -1, self.num_experts))
    token_priority = paddle.max(paddle.transpose(token_priority, [1, 0, 2]), axis=1)
    valid_mask = paddle.logical_and(token_priority >= 0, token_priority < capacity)
    token_priority = paddle.masked_fill(token_priority, ~valid_mask, 0)
    dispatch_mask = F.one_hot(token_priority, capacity).cast(paddle.int32)
    valid_mask = valid_mask.unsqueeze(-1).expand(valid_mask.shape + [capacity])
    return paddle.masked_fill(dispatch_mask, ~valid_mask, 0)


def _mixtral_block_forward(self, hidden_states):
    """`MixtralSparseMoeBlock.forward`: ``[B, T, H]`` -> (``[B, T, H]``, router logits ``[B*T, E]``)."""
    batch_size, seq_len, hidden_dim = hidden_states.shape
    hidden_states = hidden_states.reshape([-1, hidden_dim])
    router_logits = self.gate(hidden_states)
    with paddle.amp.auto_cast(False):
        routing_weights = F.softmax(router_logits.astype("float32"), axis=1)
    routing_weights, selected_experts = paddle.topk(routing_weights, self.top_k, axis=-1)
    routing_weights /= routing_weights.sum(axis=-1, keepdim=True)
    routing_weights = routing_weights.astype(hidden_states.dtype)
    final_hidden_states = paddle.zeros([batch_size * seq_len, hidden_dim], dtype=hidden_states.dtype)
    expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).transpose([2, 1, 0]).to("bool")
    for expert_id in range(self.num_experts):
        idx, top_x = paddle.where(expert_mask[expert_id])
        if top_x.shape[0] == 0:
            continue
        top_x, idx = top_x.reshape([-1]), idx.reshape([-1])
        current_state = paddle.gather(hidden_states, top_x)
        weight = routing_weights[top_x, idx].reshape([-1, 1])
        current_hidden_states = self.experts[expert_id](current_state) * weight
        final_hidden_states.index_add_(top_x, 0, current_hidden_states.astype(hidden_states.dtype))
    return final_hidden_states.reshape([batch_size, seq_len, hidden_dim]), router_logits


def apply():
    """Mend PaddleNLP's two MoE methods in this process (idempotent)."""
    from paddlenlp.transformers.mixtral.modeling import MixtralSparseMoeBlock
    from paddlenlp.transformers.moe_gate import PretrainedMoEGate

    PretrainedMoEGate._priority = _priority
    MixtralSparseMoeBlock.forward = _mixtral_block_forward
