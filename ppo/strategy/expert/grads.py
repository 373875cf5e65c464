"""Expert gradients under expert parallelism.

Each rank's loss is its share of the global mean (the data-parallel convention: the ranks'
gradients are averaged). Through the exchange's backward, the owner of expert e receives the
gradient of e from every token of its expert-parallel group, summed. `sync_expert_gradients`
sums that over the ranks holding the same experts (the expert gradient group) and divides by
the number of data ranks, which gives e the gradient the one-process run gives it; an expert
no token reached on this rank but reached on a peer gets a zero gradient first (a collective
needs every member). The other parameters stay with `paddle.DataParallel`'s average.

`ExpertClipGrad`: `paddle.nn.ClipGradByGlobalNorm` whose global norm counts each expert once:
the squared norms of the experts' gradients summed over the expert-parallel group, plus the
(replicated) others, as Paddle's ``ClipGradForMOEByGlobalNorm``; under tensor parallelism
(`model_parallel_group`) the experts' sum and the other slices' (``is_distributed``) are then
summed over the model-parallel group, the replicated parameters counted once (fleet's
``HybridParallelClipGrad``, which the strategy replaces with this clip). With `sync` it runs
`sync_expert_gradients` first (for trainers that step the optimiser themselves)."""
import paddle

from .exchange import GroupComm


def sync_expert_gradients(params, layout, data_world):
    """Sum the gradients of `params` (this rank's experts) over the expert gradient group and
    divide by `data_world`, in place."""
    if not params:
        return
    has = paddle.to_tensor([int(p.grad is not None) for p in params], dtype="int64")
    if layout.grad_comm is not None:
        layout.grad_comm.all_reduce_inplace(has)
    with paddle.no_grad():
        for p, anyone in zip(params, has.numpy().tolist()):
            if not anyone:
                continue
            if p.grad is None:
                p.grad = paddle.zeros_like(p)
            grad = p.grad
            if layout.grad_comm is not None:
                layout.grad_comm.all_reduce_inplace(grad)
            grad.scale_(1.0 / data_world)


class ExpertClipGrad(paddle.nn.ClipGradByGlobalNorm):
    """Global-norm clip with the experts counted once (see the module docstring). `layout`:
    the `ExpertLayout`; `expert_params`: this rank's expert parameters."""

    def __init__(self, clip_norm, layout, expert_params, data_world, sync=False, model_parallel_group=None):
        super().__init__(clip_norm)
        self.layout, self.data_world, self.sync = layout, data_world, sync
        self.model_parallel = None if model_parallel_group is None else GroupComm(model_parallel_group)
        self.sharding = None  # a GroupComm when stage-1 sharding over the expert group holds the other parts
        self.expert_ids = {id(p) for p in expert_params}
        self.expert_params = list(expert_params)

    def _dygraph_clip(self, params_grads):
        if self.sync:
            sync_expert_gradients(self.expert_params, self.layout, self.data_world)
            have = {id(p) for p, _ in params_grads}
            params_grads = list(params_grads) + [(p, p.grad) for p in self.expert_params
                                                 if id(p) not in have and p.grad is not None]
        if self.clip_norm == float("inf"):
            return params_grads
        total = squared_norm(params_grads, self.expert_ids, self.layout.comm, self.model_parallel, self.sharding)
        norm = paddle.sqrt(total)
        limit = paddle.full([1], self.clip_norm, "float32")
        scale = limit / paddle.maximum(norm, limit)
        return [(p, g if g is None else g * scale.astype(g.dtype)) for p, g in params_grads]


def _square_sum(grads):
    squares = [paddle.sum(paddle.square(g.astype("float32"))) for g in grads]
    return paddle.add_n(squares).reshape([1]) if squares else paddle.zeros([1], "float32")


def squared_norm(params_grads, expert_ids, expert_comm, model_parallel_comm=None, sharding_comm=None):
    """``[1]`` float32: the squared global norm of `params_grads` (see the module docstring):
    the experts' (ids in `expert_ids`) summed over `expert_comm` (a `GroupComm`), the other
    slices' (``is_distributed``) added, both summed over `model_parallel_comm` (a `GroupComm`;
    None: no tensor parallelism), the replicated ones added once. With `sharding_comm` (stage-1
    sharding over the expert group: each rank holds its part of the others and its own experts)
    every sum is taken over it instead of `expert_comm`."""
    kinds = {"expert": [], "split": [], "whole": []}
    for p, g in params_grads:
        if g is not None:
            kind = "expert" if id(p) in expert_ids else ("split" if getattr(p, "is_distributed", False) else "whole")
            kinds[kind].append(g)
    expert, split, whole = (_square_sum(kinds[k]) for k in ("expert", "split", "whole"))
    if sharding_comm is None:
        expert_comm.all_reduce_inplace(expert)
    split = expert + split
    for comm, value in ((sharding_comm, split), (sharding_comm, whole), (model_parallel_comm, split)):
        if comm is not None:
            comm.all_reduce_inplace(value)
    return split + whole
