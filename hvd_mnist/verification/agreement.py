"""The proof: a few steps across every host's workers end where one worker ends.

With a fixed global batch and dropout off, N workers compute what one worker computes
(docs/parity.md). In float64 only the order of a few sums separates them, and the weights
agree within 1e-9 (tests/test_parity.py shows it at any -np and on both paths). A host
whose arithmetic, library or link is wrong misses by orders of magnitude more.
Both runs are hvd_mnist.main itself, each in its own model_dir under a temporary
directory on this host (rank 0 runs here and alone writes), removed afterwards.
"""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile

from hvd_mnist.errors import short_reason
from hvd_mnist.verification import hosts as hosts_lib, launch
from hvd_mnist.worker import quiet

TOLERANCE = 1e-9
PER_WORKER_BATCH = 16
SEED = 42


@dataclasses.dataclass(frozen=True)
class Outcome:
    workers: int
    steps: int
    difference: float | None = None  # largest absolute weight difference; None: no result
    problems: tuple = ()

    @property
    def passed(self) -> bool:
        return not self.problems and self.difference is not None and (
            self.difference <= TOLERANCE)

    def verdict_line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        if self.difference is None:
            return f"FAIL: no weights to compare after {self.steps} steps"
        return (f"largest weight difference {self.difference:.3g} after {self.steps} float64 "
                f"steps at -np {self.workers} against -np 1 (at most {TOLERANCE:g}): {verdict}")


def trainer(data_dir: str, model_dir: str, global_batch_size: int, steps: int) -> list:
    return [sys.executable, "-m", "hvd_mnist.main", f"--data_dir={data_dir}",
            f"--model_dir={model_dir}", "--precision=float64", "--nodropout", f"--seed={SEED}",
            f"--global_batch_size={global_batch_size}", "--epochs=1",
            f"--max_steps_per_epoch={steps}", "--log_every=0", "--noexport",
            "--progress=lines"]


def horovodrun(config, workers: int, program: list) -> list:
    return launch.horovodrun_command(
        workers, program, hosts=hosts_lib.horovodrun_hosts(config.hosts),
        flags=launch.options(config.controller, config.ssh_port, config.ssh_identity_file,
                             config.network_interface, disable_cache=True))


def failure_reason(output: str) -> str:
    """The line that says why a run failed: hvd_mnist's error line, else the last line."""
    errors = re.findall(r"^(?:\[\d+\]<std\w+>:)?(\S+: error: .*)$", output, re.M)
    lines = [line for line in output.splitlines() if line.strip()]
    return errors[0] if errors else (lines[-1].strip() if lines else "no output")


def run_job(command: list, what: str, timeout_seconds: int) -> str:
    """"" when the job succeeded; else one line saying how it failed."""
    try:
        result = launch.run(command, timeout_seconds)
    except subprocess.TimeoutExpired:
        return f"{what} did not end within {timeout_seconds} s"
    if result.returncode != 0:
        return (f"{what} failed (exit {result.returncode}): "
                f"{failure_reason(result.stdout + result.stderr)}")
    return ""


def model_weights(model_dir: str) -> dict:
    """Every float64 variable of the run's last checkpoint, by key: the weights and the
    optimizer's slots. (Where the weights are keyed depends on the Keras version: Keras 3
    files them under the optimizer's tracked variables.)"""
    import tensorflow as tf
    with quiet.native_info_lines_dropped():  # TF 2.21's oneDNN notice, at first use
        reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(
            os.path.join(model_dir, "checkpoints")))
    return {key: reader.get_tensor(key)
            for key, dtype in reader.get_variable_to_dtype_map().items()
            if dtype == tf.float64}


def largest_difference(weights_a: dict, weights_b: dict) -> float:
    import numpy as np
    if not weights_a or set(weights_a) != set(weights_b):
        raise ValueError(f"the two runs' checkpoints hold other variables: "
                         f"{sorted(set(weights_a) ^ set(weights_b))}")
    return max(float(np.max(np.abs(weights_a[key] - weights_b[key]))) for key in weights_a)


def run(config) -> Outcome:
    """--steps float64 steps at -np (all slots) across the hosts, then at -np 1 here."""
    workers = sum(host.slots for host in config.hosts)
    global_batch_size = PER_WORKER_BATCH * workers
    temporary = tempfile.mkdtemp(prefix="hvd_mnist_verify-")
    try:
        many, one = (os.path.join(temporary, f"np{n}") for n in (workers, 1))
        problem = run_job(
            horovodrun(config, workers, trainer(config.data_dir, many, global_batch_size,
                                                config.steps)),
            f"the run at -np {workers} on {hosts_lib.horovodrun_hosts(config.hosts)}",
            config.timeout_seconds)
        problem = problem or run_job(
            trainer(config.data_dir, one, global_batch_size, config.steps),
            "the run at -np 1", config.timeout_seconds)
        if problem:
            return Outcome(workers, config.steps, problems=(problem,))
        try:
            difference = largest_difference(model_weights(many), model_weights(one))
        except Exception as e:  # a missing or unreadable checkpoint: one line, no traceback
            return Outcome(workers, config.steps,
                           problems=(f"cannot compare the runs ({short_reason(e)})",))
        return Outcome(workers, config.steps, difference)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
