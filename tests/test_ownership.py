"""A model_dir belongs to one run at a time (outputs/ownership.py), against real processes.

The holder is another Python process, as a second job's rank 0 would be; the real jobs
are in test_faults.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from conftest import snapshot
from hvd_mnist.errors import UserFacingError
from hvd_mnist.outputs import ownership

HOLD = ("import sys; from hvd_mnist.outputs import ownership; "
        "ownership.take(sys.argv[1], job=sys.argv[2]); print('held', flush=True); sys.stdin.read()")


@pytest.fixture
def holder():
    """holder(model_dir, job=""): a process that takes model_dir and keeps it until killed."""
    processes = []

    def start(model_dir, job=""):
        process = subprocess.Popen([sys.executable, "-c", HOLD, str(model_dir), job],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline() == "held\n"
        processes.append(process)
        return process

    yield start
    for process in processes:
        process.kill()
        process.wait()


def recorded_holder(model_dir):
    return json.loads((model_dir / ownership.LOCK_FILE).read_text())


def test_the_lock_file_names_host_pid_and_start_time(holder, tmp_path):
    process = holder(tmp_path)
    record = recorded_holder(tmp_path)
    assert (record["host"], record["pid"]) == (socket.gethostname(), process.pid)
    assert record["started_utc"].endswith("Z")


def test_a_second_run_is_refused_naming_the_holder_and_writes_nothing(holder, tmp_path):
    process = holder(tmp_path)
    record = recorded_holder(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(UserFacingError) as error:
        ownership.take(str(tmp_path))
    assert str(error.value) == (
        f"--model_dir={tmp_path} is in use by another run (host {record['host']}, pid "
        f"{process.pid}, started {record['started_utc']}); wait for it to end, or use "
        "another --model_dir")
    assert snapshot(tmp_path) == before
    ownership.release(str(tmp_path))  # not held here: must leave the holder's file alone
    assert recorded_holder(tmp_path) == record


def test_a_holder_that_died_is_taken_over_and_named(holder, tmp_path):
    process = holder(tmp_path)
    record = recorded_holder(tmp_path)
    process.send_signal(signal.SIGKILL)
    process.wait()
    try:
        assert ownership.take(str(tmp_path)) == (
            f"{tmp_path} was held by a run that ended without releasing it (host "
            f"{record['host']}, pid {process.pid}, started {record['started_utc']}); this run "
            "takes it over")
        assert recorded_holder(tmp_path)["pid"] == os.getpid()
    finally:
        ownership.release(str(tmp_path))


def test_a_run_that_ends_leaves_no_lock_and_the_next_takes_it_silently(tmp_path):
    assert ownership.take(str(tmp_path)) == ""
    ownership.release(str(tmp_path))
    assert not (tmp_path / ownership.LOCK_FILE).exists()
    assert ownership.take(str(tmp_path)) == ""
    ownership.release(str(tmp_path))


def test_the_directory_is_made_by_the_run_that_takes_it(tmp_path):
    model_dir = tmp_path / "new" / "model"
    ownership.take(str(model_dir))
    try:
        assert recorded_holder(model_dir)["pid"] == os.getpid()
    finally:
        ownership.release(str(model_dir))


def test_an_elastic_jobs_earlier_rank_0_counts_as_this_job_holding_it(holder, tmp_path):
    holder(tmp_path, job="job-a")
    assert ownership.take(str(tmp_path), job="job-a") == ""  # held, by the job
    with pytest.raises(UserFacingError, match="is in use by another run"):
        ownership.take(str(tmp_path), job="job-b")


def test_rank_0_of_an_elastic_job_takes_over_from_its_gone_predecessor(holder, tmp_path):
    process = holder(tmp_path, job="job-a")
    process.kill()
    process.wait()
    try:
        assert ownership.take(str(tmp_path), job="job-a").startswith(
            f"{tmp_path}: rank 0 moved here from host {socket.gethostname()}, pid "
            f"{process.pid}, started ")
    finally:
        ownership.release(str(tmp_path))
