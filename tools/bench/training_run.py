"""One run of hvd_mnist's trainer under horovodrun, and the figures the bench reads from
the summary.json it writes: steady images/s (steady_state.py), peak resident memory per
rank, and the seconds from launching horovodrun to rank 0's first finished step."""

import os
import sys
import time

from tools.bench import launch, steady_state


def measure(name: str, np_: int, flags: list, data_dir: str, out_dir: str,
            timeout_seconds: float) -> dict:
    """Runs `python -m hvd_mnist.main --data_dir --model_dir=out_dir/name flags...` on np_
    ranks, its log in out_dir/name.log; exits with one line if the run fails."""
    model_dir = os.path.abspath(os.path.join(out_dir, name))
    log_path = os.path.join(out_dir, f"{name}.log")
    program = launch.python_module("hvd_mnist.main", f"--data_dir={os.path.abspath(data_dir)}",
                                   f"--model_dir={model_dir}", *flags)
    launch_unix = time.time()
    rc, seconds = launch.job(np_, program, log_path, timeout_seconds)
    if rc != 0:
        sys.exit(f"bench: run {name} failed ({rc}); see {log_path}")
    summary = launch.read_summary(model_dir)
    timing = summary["timing"]
    return {
        "np": np_, "flags": flags, "summary": summary, "wall_seconds": seconds,
        "images_per_second": steady_state.images_per_second(timing["window_images_per_second"]),
        "peak_rss_mib": max(summary["peak_rss_mib_per_rank"]),
        "launch_to_first_step_seconds": timing["first_step_unix_time"] - launch_unix,
    }
