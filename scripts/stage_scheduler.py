"""Runs the quickstart's stages as a DAG of subprocesses on a fixed number of cores.

A stage starts once every stage it depends on is done. Ready stages start in the table's order
while cores are free; the free cores are split evenly among the stages that start together, and
each gets that many OpenMP/MKL threads (`OMP_NUM_THREADS`, `MKL_NUM_THREADS`), at most
`max_threads` (the quickstart's `--stage-threads`, default 1: a capped stage leaves the rest of
its share free for the next ready stage). A stage marked `alone` (the quickstart's SFT and
evaluation) waits until nothing else runs, and nothing starts beside it. The thread count of
every stage is then fixed by the table, the core count and the cap, not by which stage happens
to finish first, and with it the stage's numerics. An `OMP_NUM_THREADS` already in the
environment is passed on unchanged.

Each stage writes `<out>/logs/<name>.log` and, when done, `<out>/.done/<name>` (`{"wall_s": ...}`);
a stage with that marker is skipped, so a stopped run continues where it was. The first stage to
fail terminates every other running stage (and their helper processes) and stops the run with an
error naming its log.
"""
import json
import os
import subprocess
import time
from dataclasses import dataclass


@dataclass
class Stage:
    name: str  # also the name of its log and of its .done marker
    cmd: list
    deps: tuple = ()
    alone: bool = False  # run with nothing beside it (all cores)
    setup: object = None  # callable(log_dir) -> (extra args, helper process terminated with the stage)


def done_marker(out, stage):
    return os.path.join(out, ".done", stage)


def check_table(stages):
    """Raise ValueError for a duplicate stage, an unknown dependency or one listed after its stage."""
    seen = set()
    for s in stages:
        if s.name in seen:
            raise ValueError(f"stage '{s.name}' is listed twice")
        missing = [d for d in s.deps if d not in seen]
        if missing:
            raise ValueError(f"stage '{s.name}' depends on {missing}, not listed before it")
        seen.add(s.name)


def stage_env(base_env, threads, user_env=None):
    """`base_env` with the stage's thread count, unless the user set OMP_NUM_THREADS themselves."""
    env = dict(base_env)
    if "OMP_NUM_THREADS" not in (os.environ if user_env is None else user_env):
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def next_starts(stages, done, running, jobs, max_threads=None):
    """`[(stage, threads)]` to start now: `done` the finished names, `running` {name: threads};
    no stage gets more than `max_threads` threads (a stage's unused share stays free)."""
    return [(s, min(t, max_threads or t)) for s, t in _shares(stages, done, running, jobs)]


def _shares(stages, done, running, jobs):
    started = done | set(running)
    ready = [s for s in stages if s.name not in started and all(d in done for d in s.deps)]
    if not ready or any(s.alone for s in stages if s.name in running):
        return []
    free = jobs - sum(running.values())
    if ready[0].alone:
        return [(ready[0], jobs)] if not running else []
    batch = []
    for s in ready:
        if s.alone or len(batch) == free:
            break
        batch.append(s)
    if not batch:
        return []
    share, extra = divmod(free, len(batch))
    return [(s, share + (1 if i < extra else 0)) for i, s in enumerate(batch)]


def last_progress(log_path):
    """The newest progress-bar or step line of a log, shortened."""
    try:
        text = open(log_path, errors="replace").read()[-4000:]
    except OSError:
        return ""
    pieces = [p for p in text.replace("\r", "\n").split("\n") if "%|" in p or "step" in p]
    return pieces[-1].strip()[-100:] if pieces else ""


class _Running:
    def __init__(self, stage, out, threads, env, cwd):
        self.stage, self.threads, self.helper = stage, threads, None
        self.log_path = os.path.join(out, "logs", f"{stage.name}.log")
        cmd = list(stage.cmd)
        if stage.setup is not None:
            extra, self.helper = stage.setup(os.path.join(out, "logs"))
            cmd += extra
        print(f"[quickstart] {stage.name} ({threads} thread{'s' * (threads > 1)}): {' '.join(cmd[1:])}\n"
              f"[quickstart]   log: {self.log_path}", flush=True)
        self.log = open(self.log_path, "w")
        self.start = time.time()
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        for p in (self.proc, self.helper):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        self.log.close()


def run_dag(out, stages, jobs, base_env, cwd, poll_s=1.0, progress_s=5.0, max_threads=None):
    """Run every stage of `stages` (in priority order) not done yet under `out` on `jobs` cores,
    each with at most `max_threads` threads; returns `{name: wall seconds}` in table order, the
    skipped stages' from their markers."""
    check_table(stages)
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, not {jobs}")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    os.makedirs(os.path.join(out, ".done"), exist_ok=True)
    walls, done, running = {}, set(), {}
    for s in stages:
        if os.path.exists(done_marker(out, s.name)):
            walls[s.name] = json.load(open(done_marker(out, s.name)))["wall_s"]
            done.add(s.name)
            print(f"[quickstart] {s.name}: already done, skipped (--restart to redo)")
    last_report = time.time()
    try:
        while len(done) < len(stages):
            for stage, threads in next_starts(stages, done, {n: r.threads for n, r in running.items()}, jobs, max_threads):
                running[stage.name] = _Running(stage, out, threads, stage_env(base_env, threads), cwd)
            time.sleep(poll_s)
            for name, r in list(running.items()):
                if r.proc.poll() is None:
                    continue
                wall = time.time() - r.start
                r.stop()
                del running[name]
                if r.proc.returncode != 0:
                    tail = open(r.log_path, errors="replace").read()[-2500:]
                    raise SystemExit(f"[quickstart] stage '{name}' failed (exit {r.proc.returncode}); "
                                     f"see {r.log_path}\n{tail}")
                json.dump({"wall_s": wall, "threads": r.threads}, open(done_marker(out, name), "w"))
                walls[name] = wall
                done.add(name)
                print(f"[quickstart] {name}: done in {wall:.0f}s", flush=True)
            if running and time.time() - last_report >= progress_s:
                last_report = time.time()
                for name, r in running.items():
                    print(f"[quickstart]   {name}: {last_report - r.start:5.0f}s  {last_progress(r.log_path)}", flush=True)
    finally:
        for r in running.values():
            r.stop()
    return {s.name: walls[s.name] for s in stages}
