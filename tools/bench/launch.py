"""How the bench runs a job, and what it reads back. hvd_mnist's launcher
(hvd_mnist/verification/launch.py) builds the horovodrun command and its environment; here
each job runs from the repository root, so `python -m hvd_mnist.main` and `python -m
tools.bench.<module>` find this checkout's code, with its output in a log file."""

import json
import os
import subprocess
import sys
import time

from hvd_mnist.verification.launch import (  # noqa: F401
    BIN_DIR, elastic_command, environment, horovodrun_command, run)
from tools.bench import steady_state

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_EXAMPLES = 60_000  # MNIST's training split
# The PyTorch side's interpreter: make torch-venv makes its venv (tools/pins/torch.txt).
TORCH_PYTHON = os.path.join(REPO_ROOT, ".venv-torch", "bin", "python")


def torch_python() -> str:
    """TORCH_PYTHON; SystemExit saying how to make it where it is missing."""
    if not os.path.exists(TORCH_PYTHON):
        raise SystemExit(f"bench: no PyTorch venv ({TORCH_PYTHON}); make torch-venv makes it")
    return TORCH_PYTHON


def steps_in_epoch(np_: int, batch_size: int) -> int:
    """The steps of batch_size per worker one epoch holds at np_ workers: hvd_mnist refuses a
    --max_steps_per_epoch past it (117 at -np 4 of 128)."""
    return TRAIN_EXAMPLES // (batch_size * np_)


def python_module(module: str, *args, python: str = sys.executable) -> list:
    return [python, "-m", module, *args]


def run_logged(command: list, log_path: str, timeout_seconds: float, env=None):
    """Runs `command` with its output in log_path, after a `$ command` line. Returns
    (exit status, or "timeout"; wall seconds from start to exit)."""
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        try:
            rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout_seconds, env=environment(env),
                                cwd=REPO_ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.perf_counter() - start


def job(np_: int, program: list, log_path: str, timeout_seconds: float):
    """`program` on np_ local ranks, logged: run_logged's (status, seconds)."""
    return run_logged(horovodrun_command(np_, program), log_path, timeout_seconds)


def read_summary(model_dir: str) -> dict:
    """The summary.json hvd_mnist's rank 0 writes at the end of a run."""
    with open(os.path.join(model_dir, "summary.json")) as f:
        return json.load(f)


def last_json_line(output: str, prefix: str) -> dict:
    """The JSON after `prefix` on the last line that starts with it; SystemExit without one."""
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    if not lines:
        raise SystemExit(f"bench: no line starting with {prefix!r} in:\n{output[-2000:]}")
    return json.loads(lines[-1][len(prefix):])


def train(name: str, np_: int, flags: list, data_dir: str, out_dir: str,
          timeout_seconds: float) -> dict:
    """`python -m hvd_mnist.main --model_dir=out_dir/name flags...` on np_ ranks, logged to
    out_dir/name.log, and what the bench reads of its summary.json: steady images/s, peak
    RSS per rank, seconds from launch to rank 0's first step and from its last step to the
    job's exit. Exits with one line if it fails."""
    model_dir = os.path.abspath(os.path.join(out_dir, name))
    log_path = os.path.join(out_dir, f"{name}.log")
    program = python_module("hvd_mnist.main", f"--data_dir={os.path.abspath(data_dir)}",
                            f"--model_dir={model_dir}", *flags)
    launch_unix = time.time()
    rc, seconds = job(np_, program, log_path, timeout_seconds)
    if rc != 0:
        sys.exit(f"bench: run {name} failed ({rc}); see {log_path}")
    summary = read_summary(model_dir)
    timing = summary["timing"]
    return {
        "np": np_, "flags": flags, "summary": summary, "wall_seconds": seconds,
        "images_per_second": steady_state.images_per_second(timing["window_images_per_second"]),
        "peak_rss_mib": max(summary["peak_rss_mib_per_rank"]),
        "launch_to_first_step_seconds": timing["first_step_unix_time"] - launch_unix,
        "last_step_to_exit_seconds": launch_unix + seconds - timing["last_step_unix_time"],
    }
