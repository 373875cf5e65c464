"""`offload_level`: keep PPO's models and optimizer states in host memory between the phases
of a step that use them (PaddleNLP's `llm/alignment/ppo` offload, same three words).

- ``freeze_model``: the reference and reward models (frozen);
- ``train_model``: the actor and the critic;
- ``optimizer``: the actor's and critic's AdamW moments and master weights.

A phase declares what it uses (`OffloadPlan.scope("actor", "reference")`); the objects of
an offloaded category are moved to the device on entry and back to pinned host memory on
exit, so at any time only the models of the running phase occupy device memory. On a
build without CUDA the parameters already live in host memory: the plan does nothing and
says so once. The moves themselves are done by a `DeviceMover` (parameters: a copy to the
target place whose buffer the parameter then shares, as PaddleNLP's `_move_param`;
optimizer states: the accumulators replaced by pinned / device copies).
"""
import contextlib
import logging

import paddle

logger = logging.getLogger("ppo.offload")

OFFLOAD_LEVELS = ("freeze_model", "optimizer", "train_model")
MODEL_CATEGORY = {"actor": "train_model", "critic": "train_model", "reference": "freeze_model", "reward": "freeze_model",
                  "cost": "freeze_model", "cost_critic": "train_model"}  # cost, cost_critic: PPO-Lagrangian
OPTIMIZER_OF = {"actor": "actor_optimizer", "critic": "critic_optimizer", "cost_critic": "cost_critic_optimizer"}


def parse_offload_level(text):
    """The set of categories named in `text` (space- or comma-separated); ValueError for an
    unknown word."""
    words = [w for w in str(text or "").replace(",", " ").split() if w]
    unknown = [w for w in words if w not in OFFLOAD_LEVELS]
    if unknown:
        raise ValueError(f"offload_level: unknown {unknown}; use any of {list(OFFLOAD_LEVELS)} separated by spaces")
    return frozenset(words)


class DeviceMover:
    """Moves parameters and optimizer states between the accelerator and pinned host memory."""

    @staticmethod
    def _move_param(param, place):
        moved = param._copy_to(place, True)
        target = param.value().get_tensor()
        target._clear()
        target._share_data_with(moved.value().get_tensor())

    def model_to_host(self, model):
        for param in model.parameters():
            if param._is_initialized() and not isinstance(param.place, paddle.CUDAPinnedPlace):
                self._move_param(param, paddle.CUDAPinnedPlace())

    def model_to_device(self, model):
        place = paddle.CUDAPlace(paddle.distributed.ParallelEnv().device_id)
        for param in model.parameters():
            if param._is_initialized() and not isinstance(param.place, paddle.CUDAPlace):
                self._move_param(param, place)

    @staticmethod
    def _states(optimizer):
        """The optimizer's state dicts (name -> tensor) that AdamW keeps per parameter."""
        dicts = [optimizer._accumulators.get(optimizer._moment1_acc_str, {}),
                 optimizer._accumulators.get(optimizer._moment2_acc_str, {})]
        return dicts + [getattr(optimizer, "_master_weights", {}) or {}]

    def optimizer_to_host(self, optimizer):
        for states in self._states(optimizer):
            for key, value in states.items():
                if value._is_initialized() and not isinstance(value.place, paddle.CUDAPinnedPlace):
                    states[key] = value.pin_memory()

    def optimizer_to_device(self, optimizer):
        for states in self._states(optimizer):
            for key, value in states.items():
                if value._is_initialized() and not isinstance(value.place, paddle.CUDAPlace):
                    states[key] = value.cuda()


def offload_possible():
    """True when parameters live on a CUDA device (the only case where offloading frees memory)."""
    return paddle.is_compiled_with_cuda() and paddle.device.get_device().startswith("gpu")


class OffloadPlan:
    """Which of PPO's models and optimizers live in host memory outside the phases that use them.

    `models`: name -> model (actor, reference, reward, critic; None entries are skipped);
    `optimizers`: name -> optimizer (actor_optimizer, critic_optimizer). `levels` from
    `parse_offload_level`. `mover` (default `DeviceMover`) and `enabled` (default
    `offload_possible()`) are arguments so the schedule can be tested without a GPU.
    """

    def __init__(self, levels, models, optimizers, mover=None, enabled=None):
        self.levels = frozenset(levels)
        self.models = {n: m for n, m in models.items() if m is not None}
        self.optimizers = {n: o for n, o in optimizers.items() if o is not None}
        self.enabled = bool(self.levels) and (offload_possible() if enabled is None else enabled)
        self.mover = mover or DeviceMover()
        if self.levels and not self.enabled:
            logger.warning(
                "offload_level %s does nothing here: parameters and optimizer states already live in host memory "
                "(no CUDA device)", " ".join(sorted(self.levels)),
            )
        self.on_host = set()

    def _objects(self, names):
        """`(kind, name, obj)` of the offloaded objects that the models `names` need."""
        out = []
        for name in names:
            model = self.models.get(name)
            if model is not None and MODEL_CATEGORY[name] in self.levels:
                out.append(("model", name, model))
            opt_name = OPTIMIZER_OF.get(name)
            if opt_name in self.optimizers and "optimizer" in self.levels:
                out.append(("optimizer", opt_name, self.optimizers[opt_name]))
        return out

    def _move(self, kind, name, obj, to_host):
        if to_host == (name in self.on_host):
            return
        getattr(self.mover, f"{kind}_to_{'host' if to_host else 'device'}")(obj)
        (self.on_host.add if to_host else self.on_host.discard)(name)

    def offload_all(self):
        """Move every offloaded object to host memory (once, before the first phase)."""
        if self.enabled:
            for kind, name, obj in self._objects(MODEL_CATEGORY):
                self._move(kind, name, obj, to_host=True)

    @contextlib.contextmanager
    def scope(self, *names, with_optimizer=False):
        """Within the block the models `names` (and, `with_optimizer`, their optimizers) are on
        the device; on exit they go back to host memory if their category is offloaded."""
        objects = [o for o in self._objects(names) if with_optimizer or o[0] == "model"] if self.enabled else []
        for kind, name, obj in objects:
            self._move(kind, name, obj, to_host=False)
        try:
            yield
        finally:
            for kind, name, obj in objects:
                self._move(kind, name, obj, to_host=True)
