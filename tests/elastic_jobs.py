"""Elastic horovodrun jobs for tests/test_elastic.py: starting one on a hosts file that
the test edits, and reading back what every process trained (--example_log).

On one machine each slot is its own "host" (localhost, 127.0.0.1) in a hosts file that
tools/discover_hosts.sh prints. `read_example_log` turns the processes' logs into what
the tests check: per epoch, every example trained exactly once by the steps that were
kept, and which steps a reset rolled back and had re-done.
"""

import collections
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import HOROVOD_TEST_ENV, TINY_TEST, TINY_TRAIN, load_weights, trainer_command
from hvd_mnist.verification import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISCOVER = os.path.join(ROOT, "tools", "discover_hosts.sh")
WITH_FAULT = os.path.join(os.path.dirname(__file__), "with_fault.py")
HOSTS = ("localhost:1", "127.0.0.1:1")
# 480 tiny examples: 15 steps of 2 x 16 per epoch at 2 workers, 30 of 16 at 1.
FLAGS = ["--batch_size=16", "--log_every=0", "--threads_per_rank=1", "--commit_every=4"]


def write_hosts(path, hosts):
    path.write_text("".join(f"{host}\n" for host in hosts))


def start_elastic(tiny_data_dir, model_dir, hosts_file, *extra, np_=2, fault=None):
    """An elastic horovodrun (np_ workers to start, then 1 to 2) in the background; its
    output in model_dir."""
    trainer = trainer_command(f"--data_dir={tiny_data_dir}", f"--model_dir={model_dir}",
                              "--elastic", f"--example_log={model_dir}/examples",
                              f"--export_weights_dir={model_dir}/weights", *FLAGS, *extra)
    if fault:
        trainer = [sys.executable, WITH_FAULT, *trainer[2:]]
    env = {**HOROVOD_TEST_ENV, "HVD_MNIST_HOSTS_FILE": str(hosts_file)}
    if fault:
        env["HVD_MNIST_TEST_FAULT"] = fault
    output = open(model_dir / "horovodrun.log", "w")
    return subprocess.Popen(launch.elastic_command(np_, len(HOSTS), DISCOVER, trainer),
                            stdout=output, stderr=subprocess.STDOUT, text=True,
                            env=launch.environment(env), cwd=ROOT)


def finish(process, model_dir, timeout=420):
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        returncode = "timeout"
    return returncode, (model_dir / "horovodrun.log").read_text()


def log_records(model_dir):
    """{pid: [records]} from every process's example log (the lines written so far)."""
    records = {}
    for path in (model_dir / "examples").glob("examples-*.jsonl"):
        pid = int(path.stem.split("-")[1])
        records[pid] = [json.loads(line) for line in path.read_text().splitlines()
                        if line.endswith("}")]
    return records


def wait_for(condition, model_dir, process, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition(log_records(model_dir))
        if found:
            return found
        assert process.poll() is None, (model_dir / "horovodrun.log").read_text()
        time.sleep(0.2)
    pytest.fail(f"waited {timeout} s in vain\n" + (model_dir / "horovodrun.log").read_text())


def read_example_log(model_dir):
    """Per epoch, examples of kept steps and of rolled-back steps; the starts, in order.

    A step logged in start n at (epoch, position) was rolled back when start n+1 began
    at or before it: training went on from a commit before that step.
    """
    records = [r for rs in log_records(model_dir).values() for r in rs]
    starts = {}
    for r in records:
        if "start" in r:
            starts.setdefault(r["start"], []).append(r)
    kept, redone = collections.defaultdict(list), collections.defaultdict(list)
    for r in records:
        if "step" not in r:
            continue
        following = starts.get(r["step"] + 1)
        rolled_back = following and ((r["epoch"], r["position"]) >=
                                     (following[0]["epoch"], following[0]["position"]))
        (redone if rolled_back else kept)[r["epoch"]].append(r)
    return kept, redone, starts


def assert_every_example_once_per_epoch(kept, epochs):
    assert sorted(kept) == list(range(1, epochs + 1))
    for epoch, steps in kept.items():
        counts = collections.Counter(i for r in steps for i in r["examples"])
        assert sorted(counts) == list(range(TINY_TRAIN)), f"epoch {epoch}: examples skipped"
        assert set(counts.values()) == {1}, f"epoch {epoch}: examples trained twice"


def assert_finished_like_a_normal_run(model_dir, epochs, num_workers, first_epoch=1):
    summary = json.loads((model_dir / "summary.json").read_text())
    assert (summary["first_epoch"], summary["epochs_run"], summary["num_workers"]) == (
        first_epoch, epochs - first_epoch + 1, num_workers)
    latest = tf.train.latest_checkpoint(model_dir / "checkpoints")
    assert latest.endswith(f"ckpt-{epochs}")
    reader = tf.train.load_checkpoint(latest)
    assert reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE") == epochs
    for rank in range(num_workers):
        weights = load_weights(model_dir / f"weights/weights_rank{rank}.npz")
        assert all(np.isfinite(w).all() for w in weights)
    about = json.loads((model_dir / "export/hvd_mnist_export.json").read_text())
    assert (about["epochs_run"], about["num_workers"]) == (epochs - first_epoch + 1, num_workers)
    return summary


def assert_export_reproduces_the_accuracy(model_dir, summary, tiny_data_dir):
    predicted = subprocess.run(
        [sys.executable, "-m", "hvd_mnist.predict", f"--model={model_dir / 'export'}",
         "--test_split", f"--data_dir={tiny_data_dir}"], capture_output=True, text=True,
        timeout=300)
    assert predicted.returncode == 0, predicted.stderr
    correct = round(summary["test_accuracy"] * TINY_TEST)
    assert predicted.stdout.splitlines()[-1] == (
        f"accuracy: {100 * correct / TINY_TEST:.2f}% ({correct} of {TINY_TEST} images)")
