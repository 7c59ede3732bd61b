"""Preemption and mid-epoch checkpoints in real `horovodrun -np 2` jobs.

SIGTERM to horovodrun (what Slurm and Kubernetes send) or to any one worker stops
every rank after the same step; rank 0 saves it; every worker prints its line and
exits 75, well inside the 5 s horovodrun gives them before its SIGKILL. `--resume`
then continues at the next step and ends with exactly the weights of test_faults.py's
uninterrupted reference run (the same flags: 3 epochs of 5 steps, dropout on,
--deterministic).
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import elastic_jobs as elastic
from conftest import (TINY_TRAIN, assert_no_rank_traceback, horovodrun,
                      horovodrun_in_background)
from hvd_mnist.data import splits
from test_faults import (WITH_FAULT, assert_bitwise_equal, command, final_weights,  # noqa: F401
                         reference, run)

pytestmark = pytest.mark.horovodrun


def sigterm_before_step(tiny_data_dir, model_dir, step, rank=None):
    """Holds every rank (or `rank` only) just before its `step`-th step, sends SIGTERM to
    horovodrun (or to that rank's process), and lets each held rank go on once it has the
    signal. Returns the finished job and the seconds from the SIGTERM to its exit."""
    go_file = model_dir / "go"
    fault = f"wait_for_signal_before_step:{step}" + (f":{rank}" if rank is not None else "")
    job = horovodrun_in_background(
        2, command(tiny_data_dir, model_dir, fault=fault),
        env={"HVD_MNIST_TEST_FAULT": fault, "HVD_MNIST_TEST_GO_FILE": str(go_file)})
    held = (0, 1) if rank is None else (rank,)
    deadline = time.monotonic() + 120
    waiting = [model_dir / f"go.waiting{r}" for r in held]
    while not all(path.exists() and path.read_text() for path in waiting):  # its pid
        assert job.poll() is None and time.monotonic() < deadline, "never reached the step"
        time.sleep(0.1)
    signalled = time.monotonic()
    if rank is None:
        job.send_signal(signal.SIGTERM)
    else:
        os.kill(int(waiting[0].read_text()), signal.SIGTERM)
    stdout, stderr = job.communicate(timeout=60)
    seconds = time.monotonic() - signalled
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr), seconds


def assert_each_rank_stopped(result, lines):
    """Rank r said lines[r] and the ranks printed no traceback. Every worker exits 75, but
    once horovodrun is terminating a worker it may report that as 143 or not at all
    (Horovod 0.28.1 stops and kills the worker's shell, or reaps it first, as it races
    the shell's own exit: docs/reliability.md); never as 137, a worker it had to kill."""
    output = result.stdout + result.stderr
    for rank, line in enumerate(lines):
        said = re.findall(rf"^\[{rank}\]<stderr>:hvd_mnist: (.*)$", output, re.M)
        assert said == [line], output
    statuses = re.findall(r"Process \d exit with status code (-?\d+)\.", output)
    assert set(statuses) <= {"75", "143"}, output
    assert_no_rank_traceback(output)
    return statuses


def processes_naming(text):
    """Live processes with `text` in their command line."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_sigterm_mid_epoch_saves_the_step_and_resume_is_exact(tiny_data_dir, tmp_path,
                                                              reference):
    # Every rank has the signal before its step 6 (epoch 2, step 1), asks in step 7's
    # allreduce (step 6's requests were set before the hold), reads the answer after
    # step 8, and stops there.
    result, seconds = sigterm_before_step(tiny_data_dir, tmp_path, step=6)
    saved = f"{tmp_path}/checkpoints/mid_epoch/step-8"
    assert_each_rank_stopped(result, [
        f"preempted (SIGTERM): stopped after step 3 of 5 of epoch 2 and saved {saved}; "
        "continue with --resume"] * 2)
    assert seconds < 30, f"{seconds:.1f} s from SIGTERM to exit"
    assert processes_naming(str(tmp_path)) == [], "a worker outlived horovodrun"
    assert tf.train.latest_checkpoint(tmp_path / "checkpoints/mid_epoch") == saved
    assert tf.train.latest_checkpoint(tmp_path / "checkpoints").endswith("ckpt-1")

    resumed = run(tiny_data_dir, tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"[0]<stdout>:resuming at step 4 of epoch 2 from {saved}\n" in resumed.stdout
    assert_bitwise_equal(final_weights(tmp_path), reference)
    assert not (tmp_path / "checkpoints/mid_epoch/checkpoint").exists(), "outrun, not removed"


def test_sigterm_in_an_epochs_last_steps_saves_it_and_resume_evaluates_it(
        tiny_data_dir, tmp_path, reference):
    result, _ = sigterm_before_step(tiny_data_dir, tmp_path, step=8)  # asks in 9, reads after 10
    saved = f"{tmp_path}/checkpoints/mid_epoch/step-10"
    assert_each_rank_stopped(result, [
        f"preempted (SIGTERM): stopped after step 5 of 5 of epoch 2 and saved {saved}; "
        "continue with --resume"] * 2)
    assert "epoch 2/3:" not in result.stdout, "it evaluated before stopping"

    resumed = run(tiny_data_dir, tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming at step 6 of epoch 2 from {saved}" in resumed.stdout
    assert "[0]<stdout>:epoch 2/3: train loss" in resumed.stdout  # no step, its evaluation
    assert_bitwise_equal(final_weights(tmp_path), reference)


def test_sigterm_to_one_worker_stops_every_rank_at_the_same_step(tiny_data_dir, tmp_path):
    # Only rank 1 is held, and signalled, before its step 11; rank 0 waits for it in
    # step 11's allreduce. Nobody signals horovodrun, which reports the first worker to
    # exit as it exits, and then exits 1.
    result, seconds = sigterm_before_step(tiny_data_dir, tmp_path, step=11, rank=1)
    saved = f"{tmp_path}/checkpoints/mid_epoch/step-13"
    stopped = f"stopped after step 3 of 5 of epoch 3 and saved {saved}; continue with --resume"
    statuses = assert_each_rank_stopped(result, [
        f"preempted (a signal to another rank): {stopped}", f"preempted (SIGTERM): {stopped}"])
    assert result.returncode == 1 and statuses[0] == "75", result.stdout
    assert seconds < 30, f"{seconds:.1f} s from SIGTERM to exit"


def saved_steps(output, model_dir):
    return [int(n) for n in re.findall(
        rf"^\[0\]<stdout>:saved {model_dir}/checkpoints/mid_epoch/step-(\d+) ", output, re.M)]


def test_checkpoint_every_steps_saves_at_those_steps_and_resume_from_one_is_exact(
        tiny_data_dir, tmp_path, reference):
    # Run steps 4 and 8 (epoch 1 step 4, epoch 2 step 3); rank 1 dies before step 10.
    killed = run(tiny_data_dir, tmp_path, "--checkpoint_every_steps=4",
                 fault="kill_before_step:1:10", timeout=90)
    assert "Process 1 exit with status code 137." in killed.stdout, killed.stdout
    assert (f"[0]<stdout>:saved {tmp_path}/checkpoints/mid_epoch/step-8 (after step 3 of 5 "
            "of epoch 2)\n") in killed.stdout
    assert saved_steps(killed.stdout, tmp_path) == [4, 8]
    assert sorted(os.listdir(tmp_path / "checkpoints/mid_epoch")) == [
        "checkpoint", "step-8.data-00000-of-00001", "step-8.index"]

    resumed = run(tiny_data_dir, tmp_path, "--resume", "--checkpoint_every_steps=4")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming at step 4 of epoch 2 from" in resumed.stdout
    assert saved_steps(resumed.stdout, tmp_path) == [12]
    assert_bitwise_equal(final_weights(tmp_path), reference)


def test_checkpoint_every_minutes_saves_mid_epoch_on_rank_0s_clock(tiny_data_dir, tmp_path,
                                                                   reference):
    # 0.0001 minutes (6 ms), and 50 ms after every step: in every epoch rank 0 asks
    # before step 1 or 2, read after step 2 or 3; asks again 6 ms after that save, if
    # not in a step whose answer comes at the epoch end (there the epoch's own
    # checkpoint serves). Which steps exactly depends on timing; the rhythm itself is
    # tests/test_position.py's, on a fake clock.
    result = run(tiny_data_dir, tmp_path, "--checkpoint_every_minutes=0.0001",
                 fault="slow_until_size:0:50")
    assert result.returncode == 0, result.stdout + result.stderr
    saved = saved_steps(result.stdout, tmp_path)
    for first in (0, 5, 10):
        in_epoch = [step - first for step in saved if first < step <= first + 5]
        assert in_epoch and in_epoch[0] in (2, 3) and set(in_epoch) <= {2, 3, 4}, saved
    assert_bitwise_equal(final_weights(tmp_path), reference)


@pytest.mark.long
def test_an_elastic_run_resumes_a_mid_epoch_checkpoint_from_its_position(tiny_data_dir,
                                                                          tmp_path):
    flags = [*elastic.FLAGS, "--epochs=2", "--max_steps_per_epoch=6"]
    killed = horovodrun(2, [sys.executable, WITH_FAULT, f"--data_dir={tiny_data_dir}",
                            f"--model_dir={tmp_path}", "--checkpoint_every_steps=4", *flags],
                        timeout=120, env={"HVD_MNIST_TEST_FAULT": "kill_before_step:1:10"})
    assert "Process 1 exit with status code 137." in killed.stdout, killed.stdout
    saved = f"{tmp_path}/checkpoints/mid_epoch/step-8"  # epoch 2, step 2: 64 examples done
    assert tf.train.latest_checkpoint(tmp_path / "checkpoints/mid_epoch") == saved

    hosts = tmp_path / "hosts"
    elastic.write_hosts(hosts, elastic.HOSTS)
    job = elastic.start_elastic(tiny_data_dir, tmp_path, hosts, "--resume", *flags[-2:])
    returncode, output = elastic.finish(job, tmp_path)
    assert returncode == 0, output
    assert f"resuming at step 3 of epoch 2 from {saved}" in output
    kept, _, starts = elastic.read_example_log(tmp_path)
    assert sorted((r["epoch"], r["position"]) for r in starts[1]) == [(2, 64)] * 2
    trained = sorted(i for r in kept[2] for i in r["examples"])
    order = splits.epoch_permutation(42, 2, TINY_TRAIN)
    assert trained == sorted(order[64:192])  # the rest of epoch 2, each example once
