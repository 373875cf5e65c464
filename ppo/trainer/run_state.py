"""The run state of the online loop: where the run is (`step`, `episodes`, `gen_batches`: the
rollout draws so far, which seed the next one), the stateful parts a resume must restore
(prompt samplers, score normaliser, KL controller, divergence history, Lagrange multiplier), and
the checkpoints that carry them: `save` writes `checkpoint-<step>` atomically
(`ppo.checkpoints.checkpoint`), `resume` restores the newest one that loads (falling back to older ones
when it is damaged, never past one of another run). Model weights are written and read by the
strategy (`ppo.strategy`), which knows how the models are split over the processes."""
import logging

from ..checkpoints.checkpoint import (
    list_checkpoints, load_checkpoint, load_part_files, prepare_output_dir, save_checkpoint, save_final_models,
)
from ..checkpoints.resume_check import CheckpointMismatchError

logger = logging.getLogger("ppo")


class RunState:
    """`settings`: `CheckpointSettings`; `strategy`: the run's strategy (its model I/O);
    `tokenizer`: saved beside the models; `models` / `optimizers` / `schedulers`: `{checkpoint
    folder: object or None}` (the models unwrapped); `parts`: `{trainer_state key: object with
    state_dict / set_state_dict, or None}`, those with `save_files` / `load_files` also writing
    files of their own into each checkpoint; `run_facts`: what a resume compares
    (`ppo.checkpoints.resume_check`)."""

    def __init__(self, settings, strategy, tokenizer, *, models=None, optimizers=None, schedulers=None, parts=None,
                 run_facts=None):
        self.settings, self.strategy, self.tokenizer = settings, strategy, tokenizer
        self.models, self.optimizers, self.schedulers = dict(models or {}), dict(optimizers or {}), dict(schedulers or {})
        self.parts, self.run_facts = dict(parts or {}), dict(run_facts or {})
        self.step = 0
        self.episodes = 0
        self.gen_batches = 0  # rollout draws so far (unique group ids, the next draw's seed)

    @property
    def version(self):
        """The weights version of the policy: the training steps completed."""
        return self.step

    def state_dict(self):
        """What `trainer_state.json` records of the run."""
        state = {"step": self.step, "episodes": self.episodes, "gen_batches": self.gen_batches}
        state.update({name: (part.state_dict() if part is not None else None) for name, part in self.parts.items()})
        state["run"] = self.run_facts  # compared on resume
        return state

    def load_state_dict(self, state):
        self.step, self.episodes = state["step"], state["episodes"]
        self.gen_batches = state.get("gen_batches", state["step"])  # one draw per step before it was saved
        for name, part in self.parts.items():
            if part is not None and state.get(name) is not None:
                part.set_state_dict(state[name])

    def save(self):
        """Write `checkpoint-<step>` (collective: every rank calls it)."""
        keep_optimizers = not self.settings.ignore_save_lr_and_optim  # PaddleNLP: smaller checkpoints, fresh AdamW on resume
        save_checkpoint(
            self.settings.output_dir, self.step, self.models, self.optimizers if keep_optimizers else {}, self.schedulers,
            {**self.state_dict(), "optimizer_states": keep_optimizers}, self.tokenizer, self.settings.save_total_limit,
            self.strategy, self.file_parts(),
        )

    def file_parts(self):
        return [part for part in self.parts.values() if part is not None and hasattr(part, "save_files")]

    def save_final_models(self, only=None):
        """`output_dir/<folder>` of every model (or of the model `only`) without a checkpoint:
        `save_strategy` no, or the best policy restored after the final checkpoint."""
        models = self.models if only is None else {only: self.models[only]}
        save_final_models(self.settings.output_dir, models, self.tokenizer, self.strategy)

    def resume(self):
        """Resume from the newest complete checkpoint in `output_dir` that loads (older ones are
        tried when it does not), unless `overwrite_output_dir` starts afresh (clearing the old
        run); `resume_from_checkpoint` names one. Returns whether it resumed."""
        s = self.settings
        fresh = s.overwrite_output_dir and not s.resume_from_checkpoint
        prepare_output_dir(s.output_dir, fresh)
        if fresh:
            return False
        found = [path for _, path in reversed(list_checkpoints(s.output_dir))]
        candidates = [s.resume_from_checkpoint] if s.resume_from_checkpoint else found
        for i, path in enumerate(candidates):
            try:
                state = load_checkpoint(path, self.models, self.optimizers, self.schedulers, self.run_facts, self.strategy)
            except CheckpointMismatchError:  # another run's checkpoint: never fall back past it
                raise
            except Exception as err:  # a damaged checkpoint: fall back to the one before it
                if i == len(candidates) - 1:
                    raise
                logger.warning(f"cannot resume from {path} ({type(err).__name__}: {err}); trying {candidates[i + 1]}")
                continue
            self.load_state_dict(state)
            load_part_files(path, self.file_parts())
            logger.info(f"resumed from {path} at step {self.step}")
            return True
        return False
