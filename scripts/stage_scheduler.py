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
import contextlib
import json
import os
import signal
import subprocess
import threading
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


LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stage_launcher.py")


def can_prestart(stage):
    """Whether `stage` runs a Python script (`[python, script.py, args...]`) that
    `stage_launcher.py` can start ahead of time."""
    return len(stage.cmd) >= 2 and str(stage.cmd[1]).endswith(".py")


class _Prestarted:
    """A stage's process started ahead through `stage_launcher.py` with one thread (`env`):
    importing, then waiting (no CPU) for `release(args)`."""

    def __init__(self, stage, out, env, cwd):
        self.log_path = os.path.join(out, "logs", f"{stage.name}.log")
        self.ready_file = os.path.join(out, "logs", f".{stage.name}.imported")
        if os.path.exists(self.ready_file):
            os.remove(self.ready_file)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([stage.cmd[0], LAUNCHER, stage.cmd[1], self.ready_file], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def imported(self):
        return os.path.exists(self.ready_file)

    def release(self, args):
        """Run the script with `args`; a process that already died fails as the stage."""
        try:
            self.proc.stdin.write(json.dumps({"argv": [str(a) for a in args]}) + "\n")
            self.proc.stdin.close()
        except OSError:  # BrokenPipeError: it exited; its exit status reports it
            pass

    def stop(self):
        _terminate(self.proc)
        self.log.close()


def _terminate(proc):
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


class _Running:
    def __init__(self, stage, out, threads, env, cwd, prestarted=None):
        self.stage, self.threads, self.helper = stage, threads, None
        self.log_path = os.path.join(out, "logs", f"{stage.name}.log")
        cmd = list(stage.cmd)
        if stage.setup is not None:
            extra, self.helper = stage.setup(os.path.join(out, "logs"))
            cmd += extra
        ahead = " (started ahead)" if prestarted is not None else ""
        print(f"[quickstart] {stage.name} ({threads} thread{'s' * (threads > 1)}){ahead}: {' '.join(cmd[1:])}\n"
              f"[quickstart]   log: {self.log_path}", flush=True)
        self.start = time.time()
        if prestarted is not None:
            self.log, self.proc = prestarted.log, prestarted.proc
            prestarted.release(cmd[2:])
        else:
            self.log = open(self.log_path, "w")
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        for p in (self.proc, self.helper):
            _terminate(p)
        self.log.close()


def next_prestart(stages, done, running, prestarted, jobs, max_waiting):
    """The next stage to start ahead, or None: the first stage of the table not done, running or
    started ahead whose script `can_prestart`, while a core is free beside the running stages,
    no other started-ahead process is still importing and fewer than `max_waiting` wait."""
    if len(prestarted) >= max_waiting or sum(running.values()) >= jobs:
        return None
    if any(not p.imported() for p in prestarted.values()):
        return None
    taken = done | set(running) | set(prestarted)
    return next((s for s in stages if s.name not in taken and can_prestart(s)), None)


class _Dag:
    """One run of `run_dag`: its running and started-ahead processes and finished stages."""

    def __init__(self, out, stages, jobs, base_env, cwd, max_threads, prestart):
        self.out, self.stages, self.jobs, self.base_env, self.cwd = out, stages, jobs, base_env, cwd
        self.max_threads, self.prestart = max_threads, prestart
        self.walls, self.done, self.running, self.prestarted = {}, set(), {}, {}

    def threads_running(self):
        return {n: r.threads for n, r in self.running.items()}

    def start_ready(self):
        for stage, threads in next_starts(self.stages, self.done, self.threads_running(), self.jobs, self.max_threads):
            ahead = self.prestarted.pop(stage.name, None)  # one thread, as every stage when prestarting
            env = stage_env(self.base_env, threads)
            self.running[stage.name] = _Running(stage, self.out, threads, env, self.cwd, ahead)

    def start_ahead(self):
        stage = self.prestart and next_prestart(self.stages, self.done, self.threads_running(), self.prestarted,
                                                self.jobs, self.prestart)
        if stage:
            self.prestarted[stage.name] = _Prestarted(stage, self.out, stage_env(self.base_env, 1), self.cwd)

    def collect(self):
        """Record the stages that ended; the first that failed (or died while waiting) stops the run."""
        for name, ahead in list(self.prestarted.items()):
            if ahead.proc.poll() is not None:
                ahead.stop()
                del self.prestarted[name]
                fail(name, ahead.proc.returncode, ahead.log_path, "while it was started ahead")
        for name, r in list(self.running.items()):
            if r.proc.poll() is None:
                continue
            wall = time.time() - r.start
            r.stop()
            del self.running[name]
            if r.proc.returncode != 0:
                fail(name, r.proc.returncode, r.log_path)
            json.dump({"wall_s": wall, "threads": r.threads}, open(done_marker(self.out, name), "w"))
            self.walls[name] = wall
            self.done.add(name)
            print(f"[quickstart] {name}: done in {wall:.0f}s", flush=True)

    def stop_all(self):
        for p in list(self.running.values()) + list(self.prestarted.values()):
            p.stop()


def fail(name, code, log_path, when=""):
    tail = open(log_path, errors="replace").read()[-2500:]
    raise SystemExit(f"[quickstart] stage '{name}' failed (exit {code}){' ' + when if when else ''}; "
                     f"see {log_path}\n{tail}")


SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


def _exit_on_sigterm(signum, frame):
    print("[quickstart] stopped by SIGTERM; run the same command again to continue", flush=True)
    raise SystemExit(SIGTERM_EXIT_CODE)


@contextlib.contextmanager
def sigterm_stops_stages():
    """Inside the block SIGTERM raises SystemExit, so `run_dag` terminates its running and
    started-ahead stages and their helpers on the way out (a training stage saves a checkpoint
    on SIGTERM) instead of leaving them running. Only in the main thread (elsewhere: unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_dag(out, stages, jobs, base_env, cwd, poll_s=0.2, progress_s=5.0, max_threads=None, prestart=0):
    """Run every stage of `stages` (in priority order) not done yet under `out` on `jobs` cores,
    each with at most `max_threads` threads; returns `{name: wall seconds}` in table order, the
    skipped stages' from their markers. With `prestart` > 0 and `max_threads` 1, up to that many
    stages wait started ahead (`stage_launcher.py`), imported on a core no stage uses, one at a
    time in table order; a stage's wall time counts from its start."""
    check_table(stages)
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, not {jobs}")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    os.makedirs(os.path.join(out, ".done"), exist_ok=True)
    dag = _Dag(out, stages, jobs, base_env, cwd, max_threads, prestart if max_threads == 1 else 0)
    for s in stages:
        if os.path.exists(done_marker(out, s.name)):
            dag.walls[s.name] = json.load(open(done_marker(out, s.name)))["wall_s"]
            dag.done.add(s.name)
            print(f"[quickstart] {s.name}: already done, skipped (--restart to redo)")
    last_report = time.time()
    try:
        while len(dag.done) < len(stages):
            dag.start_ready()
            dag.start_ahead()
            time.sleep(poll_s)
            dag.collect()
            if dag.running and time.time() - last_report >= progress_s:
                last_report = time.time()
                for name, r in dag.running.items():
                    print(f"[quickstart]   {name}: {last_report - r.start:5.0f}s  {last_progress(r.log_path)}", flush=True)
    finally:
        dag.stop_all()
    return {s.name: dag.walls[s.name] for s in stages}
