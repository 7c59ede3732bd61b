"""How the bench runs a job: hvd_mnist's launcher (hvd_mnist/verification/launch.py) builds
the horovodrun command and its environment; here each job runs from the repository root,
so `python -m hvd_mnist.main` and `python -m tools.bench.<module>` find this checkout's
code, with its output in a log file."""

import json
import os
import subprocess
import sys
import time

from hvd_mnist.verification.launch import (  # noqa: F401
    BIN_DIR, environment, horovodrun_command, run)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def job(np_: int, program: list, log_path: str, timeout_seconds: float, env=None):
    """`program` on np_ local ranks, logged: run_logged's (status, seconds)."""
    return run_logged(horovodrun_command(np_, program), log_path, timeout_seconds, env)


def read_summary(model_dir: str) -> dict:
    """The summary.json hvd_mnist's rank 0 writes at the end of a run."""
    with open(os.path.join(model_dir, "summary.json")) as f:
        return json.load(f)
