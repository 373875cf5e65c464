"""The token exchange of expert parallelism: each rank's tokens reach the ranks owning their
experts, and the experts' weighted outputs come back summed per token.

Paddle 3.3.1's `alltoall` / `alltoall_single` stop on the CPU's gloo backend ("ProcessGroupGLOO
does not support all_to_all"), so the exchange is built from the collectives gloo runs, with the
same math as an all-to-all dispatch and combine (GShard, Lepikhin et al. 2021; PaddleNLP's
``MoELayer``):

* dispatch: `gather_rows` all-gathers every rank's rows ``[N_r, ...]`` of the group into
  ``[sum_r N_r, ...]``; each rank then picks the (token, slot) pairs routed to its own experts.
  Backward: the gathered rows' gradients summed over the group (all-reduce) and this rank's
  rows kept (a reduce-scatter).
* combine: `scatter_sum` sums every rank's partial outputs ``[sum_r N_r, H]`` (each rank's
  experts' weighted outputs, zero elsewhere) over the group and keeps this rank's rows.
  Backward: the all-gather of the rows' gradients.

An expert runs the rows of each source rank as a matmul of their own (`segmented_dispatch`;
``degree`` times as many, smaller matmuls): the last bits of a matmul's row depend on how many
rows it has (a CPU BLAS treats blocks of 4 rows and the rest differently), so a token's expert
output is what its own rank's unsharded block computes, bit for bit: data parallelism's numbers,
and the unsharded reference model's on that rank. (Run on the gathered rows at once, the trained
actor's log-probs differed from the reference's in the last bits where one process has them
equal; a KL gradient then turned from exactly 0 into about 1e-10, which AdamW's
``g / (|g| + eps)`` makes a few percent of a full step: Mixtral's GRPO under expert parallelism
drifted 1.8e-3 from one process in two steps.)

With ``k`` experts per token, a token's output is the sum of its ``k`` weighted expert outputs:
each rank adds its experts' terms in expert order from zero, and the ranks' partials are summed.
For ``k = 2`` this is the unsharded block's sum bit for bit; for larger ``k`` the additions are
grouped by rank (float rounding only)."""
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer


class GroupComm:
    """The two collectives the exchange uses, over a process `group` (None: every rank)."""

    def __init__(self, group=None):
        self.group = group

    def all_gather(self, x):
        """Every rank's ``x`` (equal shapes), in group rank order."""
        parts = []
        dist.all_gather(parts, x, group=self.group)
        return parts

    def all_reduce(self, x):
        """The sum of every rank's ``x``, a new tensor."""
        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def all_reduce_inplace(self, x):
        dist.all_reduce(x, group=self.group)


def row_counts(n, comm):
    """Every rank's row count (list of ints, in rank order)."""
    return [int(p.numpy()[0]) for p in comm.all_gather(paddle.to_tensor([n], dtype="int64"))]


def _all_gather_rows(x, counts, comm):
    """``[sum(counts), ...]``: every rank's ``x [counts[r], ...]`` concatenated in rank order."""
    longest = max(counts)
    if x.shape[0] < longest:  # all_gather needs equal shapes: pad, then drop the padding
        x = paddle.concat([x, paddle.zeros([longest - x.shape[0], *x.shape[1:]], dtype=x.dtype)], axis=0)
    return paddle.concat([p[:n] for p, n in zip(comm.all_gather(x), counts)], axis=0)


def _own_rows(x, counts, rank):
    start = sum(counts[:rank])
    return x[start:start + counts[rank]].clone()


class _GatherRows(PyLayer):
    @staticmethod
    def forward(ctx, x, counts, rank, comm):
        ctx.counts, ctx.rank, ctx.comm = counts, rank, comm
        return _all_gather_rows(x, counts, comm)

    @staticmethod
    def backward(ctx, dy):
        return _own_rows(ctx.comm.all_reduce(dy), ctx.counts, ctx.rank)


class _ScatterSum(PyLayer):
    @staticmethod
    def forward(ctx, partial, counts, rank, comm):
        ctx.counts, ctx.comm = counts, comm
        return _own_rows(comm.all_reduce(partial), counts, rank)

    @staticmethod
    def backward(ctx, dy):
        return _all_gather_rows(dy, ctx.counts, ctx.comm)


def gather_rows(x, counts, rank, comm):
    """All ranks' rows (see the module docstring); differentiable."""
    return _GatherRows.apply(x, counts, rank, comm)


def scatter_sum(partial, counts, rank, comm):
    """This rank's rows of the group's summed partials (see the module docstring); differentiable."""
    return _ScatterSum.apply(partial, counts, rank, comm)


def local_dispatch(x, weights, indices, experts):
    """``sum_j weights[:, j] * experts[indices[:, j]](x)`` over the experts in `experts`
    (``{global expert index: layer}``) only; rows routed elsewhere get 0 from them. ``x [M, H]``,
    ``weights [M, k]``, ``indices [M, k]``; returns ``[M, H]``. Experts in ascending order; an
    expert no row chose is not run."""
    top_k = indices.shape[1]
    flat = indices.reshape([-1])
    flat_weights = weights.reshape([-1]).astype(x.dtype)
    out = paddle.zeros_like(x)
    for e in sorted(experts):
        slots = paddle.nonzero(flat == e).reshape([-1])  # positions in [M * k]
        if slots.shape[0] == 0:
            continue
        rows = slots // top_k
        y = experts[e](paddle.gather(x, rows)) * paddle.gather(flat_weights, slots).unsqueeze(-1)
        out = paddle.index_add(out, rows, 0, y)
    return out


def segmented_dispatch(x, weights, indices, experts, counts):
    """`local_dispatch` on each source rank's rows ``counts[r]`` of the gathered ``x [sum(counts),
    H]`` (``weights`` / ``indices [sum(counts), k]``) separately, concatenated: every expert's
    matmul sees one rank's rows, as that rank's unsharded block does (see the module docstring)."""
    parts, start = [], 0
    for n in counts:
        if n:
            rows = slice(start, start + n)
            parts.append(local_dispatch(x[rows], weights[rows], indices[rows], experts))
        start += n
    return paddle.concat(parts, axis=0) if parts else paddle.zeros_like(x)


def exchange_dispatch(x, weights, indices, experts, rank, comm):
    """The MoE output ``[N, H]`` of this rank's tokens ``x [N, H]`` routed by ``weights [N, k]``
    / ``indices [N, k]`` (global expert indices) when each rank of `group` holds the experts in
    its `experts` (``{global index: layer}``). Collective: every rank of `group` calls it.

    The rows and their weights travel as one tensor ``[N, H + k]``, and the gathered tensor
    always reaches the output (a zero term), so every rank's backward runs the same collectives
    in the same order: one per gathered tensor, also on a rank whose experts no row chose."""
    counts = row_counts(x.shape[0], comm)
    hidden = x.shape[1]
    packed = gather_rows(paddle.concat([x, weights.astype(x.dtype)], axis=1), counts, rank, comm)
    all_indices = _all_gather_rows(indices, counts, comm)
    partial = segmented_dispatch(packed[:, :hidden], packed[:, hidden:], all_indices, experts, counts)
    partial = partial + packed[:, :1] * 0.0
    return scatter_sum(partial, counts, rank, comm)
