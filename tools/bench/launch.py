"""The one way the bench and the tests start a Horovod job: `horovodrun` over Gloo, with
Horovod's stall check on and a timeout, so a hang fails instead of waiting.

tests/conftest.py's `horovodrun()` and every tool here build their command line with
`horovodrun_command`. The tools run each job from the repository root, so
`python -m hvd_mnist.main` and `python -m tools.bench.<module>` find this checkout's
code whatever the caller's directory (on other hosts horovodrun changes into the same
directory).
"""

import json
import os
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# This interpreter's venv: its horovodrun, and the python its workers run.
BIN_DIR = os.path.dirname(sys.executable)
# A stalled rank ends the job within minutes instead of hanging the report.
JOB_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120",
           "TF_CPP_MIN_LOG_LEVEL": "2"}


def horovodrun_command(np_: int, program: list, hosts: str = "", flags=("--gloo",),
                       bin_dir: str = BIN_DIR) -> list:
    """`horovodrun -np N -H localhost:N --gloo program...`, with bin_dir's horovodrun.
    Gloo explicitly: where Horovod is also built with MPI, horovodrun would pick MPI."""
    return [os.path.join(bin_dir, "horovodrun"), "-np", str(np_), "-H",
            hosts or f"localhost:{np_}", *flags, *program]


def python_module(module: str, *args, python: str = sys.executable) -> list:
    return [python, "-m", module, *args]


def environment(env=None) -> dict:
    return {**os.environ, **JOB_ENV, **(env or {})}


def horovodrun(np_: int, program: list, timeout_seconds: float, env=None, cwd=None,
               bin_dir: str = BIN_DIR) -> subprocess.CompletedProcess:
    """Runs the job and returns it with its output as text; past the timeout,
    subprocess.TimeoutExpired."""
    return subprocess.run(horovodrun_command(np_, program, bin_dir=bin_dir),
                          capture_output=True, text=True, timeout=timeout_seconds, cwd=cwd,
                          env=environment(env))


def run_logged(command: list, log_path: str, timeout_seconds: float, env=None,
               cwd: str = REPO_ROOT):
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
                                cwd=cwd).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.perf_counter() - start


def job(np_: int, program: list, log_path: str, timeout_seconds: float, env=None,
        bin_dir: str = BIN_DIR):
    """`program` on np_ local ranks, logged: run_logged's (status, seconds)."""
    return run_logged(horovodrun_command(np_, program, bin_dir=bin_dir), log_path,
                      timeout_seconds, env)


def read_summary(model_dir: str) -> dict:
    """The summary.json hvd_mnist's rank 0 writes at the end of a run."""
    with open(os.path.join(model_dir, "summary.json")) as f:
        return json.load(f)
