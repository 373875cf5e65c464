"""Test-only stand-ins for the model-parallel collectives on CPU processes (gloo).

Fleet's tensor-parallel layers (`ColumnParallelLinear`, `RowParallelLinear`,
`VocabParallelEmbedding`) and PaddleNLP's `parallel_matmul` call `_c_identity`,
`_mp_allreduce`, `_c_concat` and `_c_split` from
`paddle.distributed.fleet.layers.mpu.mp_ops` (and `paddle.distributed.collective`).
On a CPU build these stop: gloo has no "calc-stream" all-reduce and `c_identity` has
no CPU kernel. `install()` replaces the four functions with `PyLayer`s built on the
plain `dist.all_reduce` / `dist.all_gather`, which gloo runs:

* identity      forward: x                      backward: all-reduce(dy)
* all-reduce    forward: all-reduce(x)          backward: dy
* concat        forward: all-gather(x) on the last axis   backward: this rank's slice
* split         forward: this rank's slice of the last axis  backward: all-gather(dy)

These are the same mathematical maps as the GPU kernels (Megatron-LM's `f` / `g`
operators), only slower. Fleet's `TensorParallel` wrapper also broadcasts every forward's
inputs from the group's first rank with a GPU/XPU-only helper; `broadcast_inputs` does it
with `dist.broadcast`. Nothing in the product imports this module: the tests (and
`tests/tp_entry.py`, which runs an entry script under `paddle.distributed.launch`)
install it. `install_pipeline` adds the two stand-ins fleet's pipeline parallelism needs;
`install_group_stores` lets fleet build groups of different members (data x tensor parallel).
"""
import os
import socket

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer


def _group_or_default(group):
    from paddle.distributed import collective

    return collective._get_default_group() if group is None else group


def _all_reduce_copy(x, group):
    out = x.clone()
    dist.all_reduce(out, group=group)
    return out


def _gather_last_axis(x, group):
    parts = []
    dist.all_gather(parts, x.contiguous() if hasattr(x, "contiguous") else x, group=group)
    return paddle.concat(parts, axis=-1)


def _own_slice_last_axis(x, group):
    width = x.shape[-1] // group.nranks
    return paddle.slice(x, axes=[x.ndim - 1], starts=[group.rank * width], ends=[(group.rank + 1) * width]).clone()


class _Identity(PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return _all_reduce_copy(dy, ctx.group)


class _AllReduce(PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce_copy(x, group)

    @staticmethod
    def backward(ctx, dy):
        return dy.clone()


class _Concat(PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last_axis(x, group)

    @staticmethod
    def backward(ctx, dy):
        return _own_slice_last_axis(dy, ctx.group)


class _Split(PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _own_slice_last_axis(x, group)

    @staticmethod
    def backward(ctx, dy):
        return _gather_last_axis(dy, ctx.group)


def c_identity(tensor, group=None, skip_c_identity_dynamic=False):
    group = _group_or_default(group)
    if skip_c_identity_dynamic or group.nranks == 1:
        return tensor
    return _Identity.apply(tensor, group)


def mp_allreduce(tensor, op=None, group=None, use_calc_stream=True, use_model_parallel=True, skip_c_identity_dynamic=False):
    group = _group_or_default(group)
    if op is not None and op != dist.ReduceOp.SUM:
        raise ValueError(f"the CPU stand-in of _mp_allreduce sums only, got op {op}")
    if group.nranks == 1:
        return tensor
    return _AllReduce.apply(tensor, group)


def c_concat(tensor, group=None):
    group = _group_or_default(group)
    return tensor if group.nranks == 1 else _Concat.apply(tensor, group)


def c_split(tensor, group=None):
    group = _group_or_default(group)
    return tensor if group.nranks == 1 else _Split.apply(tensor, group)


def _broadcast_nested(data, group, src):
    if isinstance(data, paddle.Tensor):
        dist.broadcast(data, src=src, group=group)
        return data
    if isinstance(data, (list, tuple)):
        return type(data)(_broadcast_nested(d, group, src) for d in data)
    if isinstance(data, dict):
        return {k: _broadcast_nested(v, group, src) for k, v in data.items()}
    return data


def broadcast_inputs(hcg, *inputs, **kwargs):
    """Fleet's `broadcast_input_data` on CPU: every tensor argument from the model-parallel
    group's source rank."""
    group, src = hcg.get_model_parallel_group(), hcg.get_model_parallel_group_src_rank()
    return _broadcast_nested(inputs, group, src), _broadcast_nested(kwargs, group, src)


def p2p_send(tensor, group, dst, nranks=1, rank_id=0):
    """Fleet's pipeline `_send_on_calc_stream` on CPU: a plain synchronous gloo send."""
    dist.send(tensor, dst=dst, group=group, sync_op=True)


def p2p_recv(tensor, group, src, nranks=1, rank_id=0):
    """Fleet's pipeline `_recv_on_calc_stream` on CPU: a plain synchronous gloo receive."""
    dist.recv(tensor, src=src, group=group, sync_op=True)


def whole_tensor_received(tensor, nranks=1, rank_id=0, group=None, use_calc_stream=True):
    """Fleet's `allgather_partial` after a stand-in receive: the tensor arrived whole."""
    return tensor


def install_pipeline():
    """The pipeline-parallel stand-ins (idempotent). Without them, on CPU processes:

    1. ``PipelineLayer.__init__`` (fleet ``pp_layers.py``) reads ``dist.ParallelEnv().device_id``,
       which a CPU ``ParallelEnv`` never sets (``AttributeError: 'ParallelEnv' object has no
       attribute '_device_id'``): device 0 is given;
    2. the 1F1B schedule's point-to-point transfers (``p2p_communication._send_on_calc_stream`` /
       ``_recv_on_calc_stream``) call ``ProcessGroupGLOO.send/recv_on_calc_stream``
       (``Unimplemented: ProcessGroupGLOO does not support send with sync_op and
       use_calc_stream flag``): plain synchronous ``dist.send`` / ``dist.recv`` are used;
    3. with tensor parallel too, fleet sends each tensor-parallel rank a slice of the activation
       and all-gathers the slices over the model-parallel group after receiving
       (``allgather_partial``, again a calc-stream call gloo lacks): the stand-in sends of 2.
       carry the whole tensor, so that all-gather is left out.
    """
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication
    from paddle.distributed.parallel import ParallelEnv

    if not hasattr(ParallelEnv(), "_device_id"):
        ParallelEnv._device_id = 0
    p2p_communication._send_on_calc_stream = p2p_send
    p2p_communication._recv_on_calc_stream = p2p_recv
    p2p_communication.allgather_partial = whole_tensor_received


_GROUP_STORES = {}


def _free_port(host):
    """A TCP port the OS reports free on `host` now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _gloo_group_on_own_store(original):
    """`collective._new_process_group_impl` that gives every gloo group (id > 0) a TCP store of its own.

    The group's first rank takes a port the OS reports free and publishes it on the global
    store under a key of the group id; the other members read it there. (A port fixed in
    advance can be held by some socket already, and ``TCPStore`` aborts the process when it
    cannot bind.)"""

    def impl(backend, store, rank, world_size, group_name, pg_options, group_id=0, **kwargs):
        if backend != "gloo" or group_id == 0:  # the default group: the global store
            return original(backend, store, rank, world_size, group_name, pg_options, group_id=group_id, **kwargs)
        from paddle.base import core

        host = os.environ["PADDLE_MASTER"].rsplit(":", 1)[0]
        key = f"tp_cpu_collectives/group_store_port/{group_id}"
        if rank == 0:  # hosted by the group's first rank; the others retry until it listens
            port = _free_port(host)
            store.set(key, str(port).encode())
        else:
            store.wait(key)
            port = int(bytes(store.get(key)).decode())
        own = core.TCPStore(host, port, rank == 0, world_size, 300)
        _GROUP_STORES[group_id] = own  # kept alive with the group
        return core.ProcessGroupGloo.create(own, rank, world_size, group_id)

    impl.original = original
    return impl


def install_group_stores():
    """Fleet's groups of different members on gloo (idempotent). Without it, 4 CPU processes
    with ``dp_degree 2`` and ``mp_degree 2`` stop in ``fleet.init``: ``ProcessGroupGloo`` runs
    gloo's rendezvous (``connectFullMesh``) on the one global store, keyed by the rank *inside
    the group*, so the data groups [0, 2] and [1, 3], created at the same time by disjoint
    ranks, overwrite each other's addresses, and the model group [0, 1] then reads a stale one
    (``gloo/transport/tcp/pair.cc: connect [127.0.0.1]:PORT: Connection refused`` on one rank,
    a pair ``TIMEOUT`` on the others). A group of the whole world created after others (tp 2 x
    pp 2: fleet's check group [0, 1, 2, 3]) meets the same end: a rank still reading the
    default group's keys may get its new address. Here each group but the default one
    rendezvouses on its own store, on a free port its first rank publishes on the global store
    (single-host test runs only)."""
    from paddle.distributed import collective

    if not hasattr(collective._new_process_group_impl, "original"):
        collective._new_process_group_impl = _gloo_group_on_own_store(collective._new_process_group_impl)


REPLACEMENTS = {"_c_identity": c_identity, "_mp_allreduce": mp_allreduce, "_c_concat": c_concat, "_c_split": c_split}


def install():
    """Put the stand-ins into `mp_ops` and `paddle.distributed.collective` (idempotent)."""
    from paddle.distributed import collective
    from paddle.distributed.fleet.layers.mpu import mp_layers, mp_ops
    from paddle.distributed.fleet.meta_parallel import tensor_parallel

    for module in (mp_ops, collective):
        for name, fn in REPLACEMENTS.items():
            setattr(module, name, fn)
    if hasattr(mp_layers, "mp_ops"):
        for name, fn in REPLACEMENTS.items():
            setattr(mp_layers.mp_ops, name, fn)
    tensor_parallel.broadcast_input_data = broadcast_inputs
    install_pipeline()
    install_group_stores()
    return REPLACEMENTS
