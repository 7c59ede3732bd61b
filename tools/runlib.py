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


def launch(np_: int, args: list, log_path: str, timeout_seconds: int, env=None):
    """`horovodrun -np N python args...` with its output in log_path; returns (rc, seconds)."""
    cmd = [os.path.join(BIN_DIR, "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
           sys.executable, *args]
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_seconds,
                                env={**os.environ, **STALL_ENV, **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.perf_counter() - start


def read_summary(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "summary.json")) as f:
        return json.load(f)


def machine_description() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{len(os.sched_getaffinity(0))} cores ({model}), {memory_gib:.0f} GiB, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
