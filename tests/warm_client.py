"""The caller's side of tests/warm_python.py's zygote, importable without Paddle.

`send_request` asks a zygote to fork a child that runs `python ARGV...` with the given cwd,
environment and stdout/stderr descriptors. `run_as_launch_worker` is what a worker of
`paddle.distributed.launch` calls (tests/tp_entry.py with WARM_LAUNCH_SOCK set): the worker
stays a thin process of the launcher (its pid, its log file, its exit status), while the
work runs in a zygote child that has Paddle, PaddleNLP and the entry modules imported already.
"""
import json
import os
import signal
import socket
import struct
import sys

IMPORT_TIME_ENV = ("FLAGS_", "MKL_", "OMP_", "KMP_", "CUDA_", "NVIDIA_", "PADDLE", "PYTHON", "GLOG_", "LD_", "PPNLP",
                   "HF_", "LANG", "LC_", "OPENBLAS", "NCCL_", "XPU_", "MALLOC", "JEMALLOC")
# What `paddle.distributed.launch` adds to a CPU worker's environment. Paddle and the entry
# modules read them when the run starts (fleet.init, the data loaders), not while importing;
# the module-level reads (PaddleNLP's pretraining datasets, Paddle's cache of the backup
# environment file) are refreshed by the worker (tests/tp_entry.py).
LAUNCH_ENV = ("PADDLE_MASTER", "PADDLE_GLOBAL_SIZE", "PADDLE_LOCAL_SIZE", "PADDLE_GLOBAL_RANK", "PADDLE_LOCAL_RANK",
              "PADDLE_NNODES", "PADDLE_CURRENT_ENDPOINT", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM",
              "PADDLE_RANK_IN_NODE", "PADDLE_AUTO_CLUSTER", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_DISTRI_BACKEND",
              "PADDLE_LOG_DIR", "PADDLE_BACKUP_ENV_PATH")
SOCKET_ENV = "WARM_LAUNCH_SOCK"  # the zygote socket a launch worker hands its run to
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def import_time_env(env, ignore=()):
    """The variables of `env` that Paddle, PaddleNLP or Python may read while importing."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and k not in ignore}


def zygote_env_path(sock_path):
    return os.path.join(os.path.dirname(sock_path), "import_env.json")


def send_request(sock_path, argv, cwd, env, fds, kill_on_disconnect=False):
    """Connect to the zygote at `sock_path` and ask for a child running `python *argv` with stdout
    and stderr on `fds`; returns `(socket, reply file)`: the reply's first line is the child's
    pid, the second its exit code (`-N` when killed by signal N). With `kill_on_disconnect` the
    child is killed when this socket closes (the caller died)."""
    request = json.dumps({"argv": list(argv), "cwd": os.path.abspath(cwd), "env": dict(env),
                          "kill_on_disconnect": kill_on_disconnect}).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sock_path)
    socket.send_fds(sock, [struct.pack("!Q", len(request))], fds)
    sock.sendall(request)
    return sock, sock.makefile("r")


def launch_worker_servable(env):
    """Whether a launch worker with `env` may run in the zygote named by its WARM_LAUNCH_SOCK: the
    zygote is alive and imported with the same import-time variables, save the launcher's own."""
    sock_path = env.get(SOCKET_ENV)
    if not sock_path or not os.path.exists(sock_path):
        return False
    try:
        zygote_env = json.load(open(zygote_env_path(sock_path)))
    except (OSError, ValueError):
        return False
    return import_time_env(env, LAUNCH_ENV) == import_time_env(zygote_env, LAUNCH_ENV)


def run_as_launch_worker(argv):
    """Run `python *argv` in a zygote child on this process's stdout/stderr, forwarding the
    signals a launcher sends, and exit as that child exited. Never returns."""
    env = dict(os.environ)
    sock_path = env.pop(SOCKET_ENV)
    sys.stdout.flush()
    sys.stderr.flush()
    sock, reply = send_request(sock_path, argv, os.getcwd(), env, [1, 2], kill_on_disconnect=True)
    pid = int(reply.readline())
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, lambda received, _frame: os.kill(pid, received))
    line = reply.readline()
    code = int(line) if line else 1
    if code < 0:  # killed by a signal: die of the same one, as the child did
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)
