"""Helpers for the tools that launch whole training runs and report on them."""

import datetime
import json
import os
import platform
import subprocess
import sys
import time

BIN_DIR = os.path.dirname(sys.executable)
# A stalled run fails instead of hanging the report.
STALL_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
             "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120",
             "TF_CPP_MIN_LOG_LEVEL": "2"}


def launch(np_: int, args: list, log_path: str, timeout_seconds: int, env=None, cwd=None):
    """`horovodrun -np N python args...` with its output in log_path; returns (rc, seconds).
    `cwd`: where the workers' `python -m hvd_mnist...` finds hvd_mnist (default: here)."""
    cmd = [os.path.join(BIN_DIR, "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
           sys.executable, *args]
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_seconds,
                                env={**os.environ, **STALL_ENV, **(env or {})},
                                cwd=cwd).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.perf_counter() - start


def read_summary(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "summary.json")) as f:
        return json.load(f)


def machine_description() -> str:
    """Cores, CPU model and its widest vector unit (figures differ ~2x between AVX2-only
    and AVX-512 machines of the same model name), memory, kernel and Python."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = set(next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags")))
    except (OSError, StopIteration):
        pass
    vector = ("AVX-512" if "avx512f" in flags else "AVX2-only" if "avx2" in flags
              else "no AVX2")
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{len(os.sched_getaffinity(0))} cores ({model}, {vector}), {memory_gib:.0f} GiB, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
