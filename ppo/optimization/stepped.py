"""Which parameters an optimiser step moves, made independent of how the run got there.

Paddle's ``optimizer.clear_grad()`` zeroes a gradient in place and keeps the tensor: once a
parameter has had a gradient, every later step moves it, from a zero gradient when nothing
reached it (AdamW's momentum and weight decay still act). In a mixture of experts that is an
expert no token was routed to in this step. Two things drop those zeroed tensors and would
change which parameters are stepped: a resumed run (the checkpoint holds the moments, not the
gradient tensors) and ``release_gradients`` / PaddleNLP's ``release_grads`` (``clear_grad(
set_to_zero=False)`` frees them). Left alone, a resumed run then skips an expert the
uninterrupted run steps, and ends elsewhere.

`zero_missing_gradients` restores the rule before each optimiser step: a trainable parameter
that the optimiser holds moments for (it was stepped before, in this process or in the run a
checkpoint came from) and that has no gradient gets a zero gradient. A parameter never
stepped keeps none, as before, so an uninterrupted run without released gradients steps
exactly the parameters it stepped before. (Megatron-LM's contiguous gradient buffers step every
parameter from its zeroed ``main_grad``; PyTorch's ``zero_grad(set_to_none=True)`` skips an
unreached one every time; Paddle's default sits between, and this keeps it.)

Under sharding each rank holds only its own parameters' moments and the gradients are reduced to
their owner over the group, so the rule cannot be read locally; it is left out there, except for
the parameters a sharding optimiser keeps out of its reduce and broadcast (its ``expert_ids``:
each rank's own experts under expert parallelism, `ppo.strategy.expert.sharding`), whose moments
and gradients are this rank's alone. (Before, a resumed EP x sharding stage-1 SFT run skipped an
expert that no token reached after the resume, and ended 1.3e-4 from the uninterrupted run.)"""
import paddle


def _optimizer_chain(optimizer):
    """`optimizer` and the optimisers it wraps (fleet's ``_inner_opt``), outermost first."""
    chain = []
    while optimizer is not None and all(optimizer is not o for o in chain):
        chain.append(optimizer)
        optimizer = getattr(optimizer, "_inner_opt", None)
    return chain


def _parameters(optimizer):
    params = []
    for item in optimizer._parameter_list or []:
        params.extend(item["params"] if isinstance(item, dict) else [item])
    return params


def stepped_without_gradient(optimizer):
    """The trainable parameters of `optimizer` that it holds moments for and that have no
    gradient now (see the module docstring); under sharding only those its sharding optimiser
    keeps local; [] for an optimiser without a first moment."""
    chain = _optimizer_chain(optimizer)
    local = None  # under sharding: the ids of the parameters only this rank steps (module docstring)
    if any(getattr(o, "_sharding_enable", False) or "Sharding" in type(o).__name__ for o in chain):
        local = frozenset().union(*(vars(o).get("expert_ids", ()) for o in chain))
        if not local:
            return []
    inner = chain[-1]
    key = getattr(inner, "_moment1_acc_str", None)
    if key is None:
        return []
    created = inner._accumulators.get(key, {})
    held = [k for k in getattr(inner, "_accumulators_holder", {}) if isinstance(k, str)]
    missing = [p for p in _parameters(inner)
               if not p.stop_gradient and p.grad is None and (local is None or id(p) in local)]
    if not missing:
        return []
    loaded = {k.rsplit(f"_{key}_", 1)[0] for k in held if f"_{key}_" in k}
    return [p for p in missing if p.name in created or p.name in loaded]


def zero_missing_gradients(optimizer):
    """Give every parameter `stepped_without_gradient` names a zero gradient; returns how many."""
    params = stepped_without_gradient(optimizer)
    with paddle.no_grad():
        for p in params:
            p.grad = paddle.zeros_like(p)
    return len(params)
