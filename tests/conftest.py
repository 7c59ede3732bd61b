"""Shared fixtures: a tiny MNIST-shaped dataset prepared through the real TFDS route,
and a helper that launches real `horovodrun` jobs with a timeout."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

# Quiet TensorFlow in this process and in every process the tests start.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from hvd_mnist import prepare  # noqa: E402
from hvd_mnist.verification import launch  # noqa: E402

TINY_TRAIN, TINY_TEST = 480, 100
BIN_DIR = launch.BIN_DIR
# A hang must fail the test, not eat CI's time.
HOROVOD_TEST_ENV = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "10",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


@pytest.fixture(autouse=True)
def environment_restored():
    """A test's changes to this process's environment end with it: a trainer run in-process
    sets variables for Horovod (runtime.configure_cycle_time), and the jobs later tests start
    would inherit them (launch.environment passes the caller's on)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def synthetic_digits(n: int, seed: int):
    """Learnable fake digits: class k is a bright bar in row band k, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):
        images[i, 2 + 2 * label:4 + 2 * label, 4:24] = 255
    return images, labels


def write_synthetic_idx(idx_dir, num_train=TINY_TRAIN, num_test=TINY_TEST):
    train_images, train_labels = synthetic_digits(num_train, seed=1)
    test_images, test_labels = synthetic_digits(num_test, seed=2)
    return prepare.write_idx_files(str(idx_dir), train_images, train_labels, test_images,
                                   test_labels)


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory):
    """A TFDS data_dir holding a tiny `mnist` built by the same code as the real one."""
    root = tmp_path_factory.mktemp("tiny_mnist")
    write_synthetic_idx(root / "idx")
    prepare.build_tfds_mnist(str(root / "idx"), str(root / "tfds"))
    return str(root / "tfds")


@pytest.fixture(scope="session")
def float32_reference_weights(tiny_data_dir, tmp_path_factory):
    """The one-worker custom loop's weights after test_parity's ten float32 steps: what the
    invariance checks compare against, in float32 and, as bfloat16's noise floor, in
    bfloat16 (test_precision_parity.py). One run serves both modules."""
    from test_parity import TEN_STEPS, train_weights

    return train_weights(tiny_data_dir, tmp_path_factory.mktemp("float32_reference"),
                         "custom_np1", 1, *TEN_STEPS)


@pytest.fixture(scope="session")
def tiny_sharded_data_dir(tmp_path_factory):
    """The same tiny `mnist`, each split written as 4 record files (for --input=files)."""
    root = tmp_path_factory.mktemp("tiny_mnist_4_files")
    write_synthetic_idx(root / "idx")
    prepare.build_tfds_mnist(str(root / "idx"), str(root / "tfds"), num_shards=4)
    return str(root / "tfds")


def horovodrun(np_, args, timeout=180, cwd=None, env=None):
    """Runs `horovodrun -np N <args>` and returns the completed process (text output):
    hvd_mnist's launcher with the tests' shorter stall check."""
    return launch.run(launch.horovodrun_command(np_, args), timeout,
                      env={**HOROVOD_TEST_ENV, **(env or {})}, cwd=cwd)


def horovodrun_in_background(np_, args, env=None):
    """Starts `horovodrun -np N <args>`; the caller waits for it (communicate, with a timeout)."""
    return subprocess.Popen(launch.horovodrun_command(np_, args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=launch.environment({**HOROVOD_TEST_ENV, **(env or {})}))


def assert_every_rank_said(result, error, num_ranks=2):
    """The guarantee for an error found after Horovod started (hvd_mnist's CollectiveError):
    every rank printed `error` as its one line, no rank printed a traceback, and the first
    process to exit did so with status 1.

    The ranks wait for each other's line before exiting (runtime.leave_together), so
    no line can be lost. Their exits still race horovodrun, which ends the remaining
    workers once one has failed, so what it reports of the later ones (status 1, 143 or
    137, the shell's "Terminated", or nothing) is not asserted; only that none failed in
    another way. horovodrun then names the first failed process in one line of its own
    (assert_horovodrun_said_one_line).
    """
    assert_each_rank_said(result, [error] * num_ranks)


def assert_each_rank_said(result, errors):
    """assert_every_rank_said where rank r says errors[r]: a problem that one rank found
    alone is named by that rank, and by the others as "rank R: ..." (runtime.on_every_rank)."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    statuses = re.findall(r"Process \d+ exit with status code (\d+)\.", output)
    assert statuses and statuses[0] == "1", output
    assert set(statuses) <= {"1", "137", "143"}, output
    for rank, error in enumerate(errors):
        lines = re.findall(rf"^\[{rank}\]<stderr>:hvd_mnist: error: (.*)$", output, re.M)
        assert lines == [error], f"rank {rank} said {lines}:\n{output}"
    assert_no_rank_traceback(output)
    assert_horovodrun_said_one_line(output)


def assert_some_rank_said(result, error):
    """The guarantee for an error found before Horovod starts (flags, Keras, missing data):
    each rank decides alone and horovodrun may end a slower rank before it speaks, so at
    least one rank printed `error` as its one line, none printed another error or a
    traceback, and the job failed."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    lines = re.findall(r"^\[\d+\]<stderr>:hvd_mnist: error: (.*)$", output, re.M)
    assert lines and set(lines) == {error}, f"{lines}:\n{output}"
    assert_no_rank_traceback(output)
    assert_horovodrun_said_one_line(output)


def assert_no_rank_traceback(output):
    assert not re.search(r"^\[\d+\]<std(err|out)>:Traceback", output, re.M), output


def assert_horovodrun_said_one_line(output):
    """horovodrun's own report of a failed job: one line naming the first process to fail
    and its exit code, and no traceback of the launcher's
    (tools/horovod-patches/launcher-one-line.patch)."""
    assert re.search(r"^horovodrun: process \d+ exited with status code \d+, the first to "
                     r"fail; the job was ended\.$", output, re.M), output
    assert "Traceback (most recent call last)" not in output, output


WITH_AIDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "with_aids.py")


def trainer_command(*flags):
    """hvd_mnist.main through tests/with_aids.py, which adds the testing aids' flags."""
    return [sys.executable, WITH_AIDS, *flags]


def flip_middle_4k(path):
    """Damage as a disk or a copy makes it: 4 KiB in the middle of the file inverted."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(byte ^ 0xFF for byte in data[middle:middle + 4096])
    path.write_bytes(data)


def truncate_half(path):
    os.truncate(path, os.path.getsize(path) // 2)


def snapshot(directory):
    """Every file under directory with its contents and modification time."""
    return {(path, path.read_bytes(), path.stat().st_mtime_ns)
            for path in directory.rglob("*") if path.is_file()}


@pytest.fixture
def small_disk(tmp_path):
    """mount(size): a tmpfs of that size (e.g. "600k"), unmounted after the test; skips
    where tmpfs cannot be mounted (not root), saying so."""
    mounted = []

    def mount(size):
        mount_point = tmp_path / f"disk{len(mounted)}"
        mount_point.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                           str(mount_point)], capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root): this full-disk test did not run")
        mounted.append(mount_point)
        return mount_point

    yield mount
    for mount_point in mounted:
        subprocess.run(["umount", str(mount_point)], check=True)


def load_weights(path):
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def max_abs_difference(weights_a, weights_b) -> float:
    assert len(weights_a) == len(weights_b)
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights_a, weights_b))
