"""Faults during real `horovodrun -np 2` jobs: killed workers, kills during a save, NaN
losses, damaged or foreign checkpoints, a model_dir that is or becomes unwritable or full,
a second job on a live model_dir; and exact resume afterwards.

All runs share deterministic flags, so any resumed run must end with exactly the
weights of the uninterrupted reference run: 3 epochs of 5 steps, dropout on.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from conftest import (assert_every_rank_said, horovodrun, horovodrun_in_background,
                      load_weights, max_abs_difference, snapshot, trainer_command)
from hvd_mnist.outputs import ownership

pytestmark = pytest.mark.horovodrun

FLAGS = ["--epochs=3", "--max_steps_per_epoch=5", "--batch_size=16", "--log_every=5",
         "--deterministic", "--noexport"]
WITH_FAULT = os.path.join(os.path.dirname(__file__), "with_fault.py")


def run(tiny_data_dir, model_dir, *extra, fault=None, timeout=120):
    return horovodrun(2, command(tiny_data_dir, model_dir, *extra, fault=fault),
                      timeout=timeout, env={"HVD_MNIST_TEST_FAULT": fault} if fault else None)


def command(tiny_data_dir, model_dir, *extra, fault=None):
    trainer = trainer_command(f"--data_dir={tiny_data_dir}", f"--model_dir={model_dir}",
                              f"--export_weights_dir={model_dir}/weights", *FLAGS, *extra)
    return [sys.executable, WITH_FAULT, *trainer[2:]] if fault else trainer


def final_weights(model_dir):
    return [load_weights(f"{model_dir}/weights/weights_rank{rank}.npz") for rank in (0, 1)]


def assert_bitwise_equal(weights, reference):
    for rank in (0, 1):
        assert max_abs_difference(weights[rank], reference[rank]) == 0.0, f"rank {rank}"


@pytest.fixture(scope="module")
def reference(tiny_data_dir, tmp_path_factory):
    """Final weights of the uninterrupted run."""
    model_dir = tmp_path_factory.mktemp("reference")
    result = run(tiny_data_dir, model_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    return final_weights(model_dir)


def test_same_flags_give_bitwise_identical_weights(tiny_data_dir, tmp_path, reference):
    result = run(tiny_data_dir, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_bitwise_equal(final_weights(tmp_path), reference)
    assert max_abs_difference(*reference) == 0.0, "ranks disagree"


def test_killed_worker_ends_the_job_and_resume_is_exact(tiny_data_dir, tmp_path, reference):
    # Rank 1 dies at the start of its 8th step: epoch 2, step 3, after checkpoint 1.
    started = time.monotonic()
    killed = run(tiny_data_dir, tmp_path, fault="kill_before_step:1:8", timeout=90)
    wall_seconds = time.monotonic() - started
    output = killed.stdout + killed.stderr
    assert killed.returncode != 0 and wall_seconds < 60, output
    assert "Process 1 exit with status code 137." in output
    assert "Terminating remaining workers after failure of Process 1." in output
    assert "epoch 1/3:" in output and "epoch 2/3:" not in output
    assert tf.train.latest_checkpoint(tmp_path / "checkpoints").endswith("ckpt-1")

    resumed = run(tiny_data_dir, tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after epoch 1" in resumed.stdout
    assert_bitwise_equal(final_weights(tmp_path), reference)


def test_kill_during_save_keeps_the_previous_checkpoint(tiny_data_dir, tmp_path, reference):
    killed = run(tiny_data_dir, tmp_path, fault="kill_in_save:2")
    assert killed.returncode != 0, killed.stdout + killed.stderr
    assert "Process 0 exit with status code 137." in killed.stdout
    assert (tmp_path / "checkpoints/ckpt-2.index").exists(), "the kill came too early"
    assert tf.train.latest_checkpoint(tmp_path / "checkpoints").endswith("ckpt-1")

    resumed = run(tiny_data_dir, tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after epoch 1" in resumed.stdout
    assert_bitwise_equal(final_weights(tmp_path), reference)


@pytest.fixture(scope="module")
def nan_run(tiny_data_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("nan")
    return model_dir, run(tiny_data_dir, model_dir, "--inject_nan_at_step=7")


def test_nan_loss_stops_every_rank_naming_the_step(nan_run):
    model_dir, result = nan_run
    assert_every_rank_said(result, (
        "training diverged: loss is nan at step 7 (epoch 2, step 2 of 5); lower "
        "--learning_rate or check the input data"))
    assert tf.train.latest_checkpoint(model_dir / "checkpoints").endswith("ckpt-1")
    assert not list((model_dir / "checkpoints").glob("ckpt-2*")), "NaN weights were saved"
    assert not (model_dir / "weights").exists()


def test_resume_from_a_truncated_checkpoint_stops_every_rank(nan_run, tiny_data_dir, tmp_path):
    shutil.copytree(nan_run[0] / "checkpoints", tmp_path / "checkpoints")
    data_file = tmp_path / "checkpoints/ckpt-1.data-00000-of-00001"
    os.truncate(data_file, os.path.getsize(data_file) // 2)
    result = run(tiny_data_dir, tmp_path, "--resume", timeout=90)
    assert_every_rank_said(result, (
        f"cannot restore checkpoint {tmp_path}/checkpoints/ckpt-1 (Read less bytes than "
        "requested); its .index and .data files are damaged or from a different model: "
        "delete them or use another --model_dir"))
    assert "epoch 1/3" not in result.stdout, "it started training anyway"


def test_unwritable_model_dir_stops_every_rank_before_training(tiny_data_dir, tmp_path):
    (tmp_path / "a_file").write_text("")  # even root cannot create a directory inside a file
    result = run(tiny_data_dir, tmp_path / "a_file/model", timeout=90)
    assert_every_rank_said(
        result, f"--model_dir={tmp_path}/a_file/model is not writable (Not a directory)")
    assert "training on" not in result.stdout


def test_resume_into_another_optimizer_is_refused_and_changes_nothing(nan_run, tiny_data_dir,
                                                                      tmp_path):
    shutil.copytree(nan_run[0], tmp_path, dirs_exist_ok=True)  # ckpt-1 of an Adadelta run
    before = snapshot(tmp_path)
    result = run(tiny_data_dir, tmp_path, "--resume", "--optimizer=adam", timeout=90)
    assert_every_rank_said(result, (
        f"cannot resume from {tmp_path}/checkpoints/ckpt-1: it belongs to another run "
        "(--optimizer was adadelta, now adam); resume with --optimizer=adadelta, or start "
        "afresh with another --model_dir"))
    assert snapshot(tmp_path) == before, "the refused run wrote to model_dir"


def test_disk_full_at_the_first_save_stops_every_rank_with_one_line(tiny_data_dir,
                                                                     small_disk):
    model_dir = small_disk("600k")  # config.json fits, a 14.4 MB checkpoint does not
    result = run(tiny_data_dir, model_dir, timeout=90)
    assert_every_rank_said(result, (
        f"cannot write checkpoint {model_dir}/checkpoints/ckpt-1 (No space left on device); "
        "none was kept: free space or fix the directory, then continue with --resume"))
    assert os.listdir(model_dir / "checkpoints") == [], "the failed save left files behind"


def test_disk_full_mid_run_keeps_the_last_checkpoint_and_resume_is_exact(
        tiny_data_dir, tmp_path, small_disk, reference):
    model_dir = small_disk("20m")  # room for checkpoint 1, not 2
    started = time.monotonic()
    result = run(tiny_data_dir, model_dir, timeout=90)
    assert time.monotonic() - started < 60
    assert_every_rank_said(result, (
        f"cannot write checkpoint {model_dir}/checkpoints/ckpt-2 (No space left on device); "
        f"the latest checkpoint is still {model_dir}/checkpoints/ckpt-1: free space or fix "
        "the directory, then continue with --resume"))
    assert sorted(os.listdir(model_dir / "checkpoints")) == [
        "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]

    roomy = tmp_path / "roomy"  # the user frees space: here, moves to a larger disk
    shutil.copytree(model_dir, roomy)
    resumed = run(tiny_data_dir, roomy, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after epoch 1" in resumed.stdout
    assert_bitwise_equal(final_weights(roomy), reference)


def test_checkpoint_directory_made_unwritable_mid_run_stops_every_rank(tiny_data_dir, tmp_path):
    try:
        result = run(tiny_data_dir, tmp_path, fault="unwritable_before_save:2", timeout=90)
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "checkpoints")], capture_output=True)
        os.chmod(tmp_path / "checkpoints", 0o755)
    reason = "Operation not permitted" if os.geteuid() == 0 else "Permission denied"
    assert_every_rank_said(result, (
        f"cannot write checkpoint {tmp_path}/checkpoints/ckpt-2 ({reason}); the latest "
        f"checkpoint is still {tmp_path}/checkpoints/ckpt-1: free space or fix the directory, "
        "then continue with --resume"))
    assert tf.train.latest_checkpoint(tmp_path / "checkpoints").endswith("ckpt-1")
    assert not list((tmp_path / "checkpoints").glob("ckpt-2*"))


def lock_holder(model_dir):
    return json.loads((model_dir / ownership.LOCK_FILE).read_text())


@pytest.mark.long  # the lock itself is tests/test_ownership.py's; this is the whole job
def test_a_second_job_on_a_live_model_dir_is_refused_and_the_first_ends_intact(
        tiny_data_dir, tmp_path, reference):
    model_dir, go_file = tmp_path / "model", tmp_path / "go"
    first = horovodrun_in_background(
        2, command(tiny_data_dir, model_dir, fault="wait_before_step:8"),
        env={"HVD_MNIST_TEST_FAULT": "wait_before_step:8", "HVD_MNIST_TEST_GO_FILE": str(go_file)})
    try:
        deadline = time.monotonic() + 120  # the first job holds still in epoch 2
        while not os.path.exists(f"{go_file}.waiting0") and first.poll() is None:
            assert time.monotonic() < deadline, "the first job never reached step 8"
            time.sleep(0.2)
        assert first.poll() is None, first.communicate()
        holder = lock_holder(model_dir)
        before = snapshot(model_dir)

        second = run(tiny_data_dir, model_dir, "--resume", timeout=90)
        assert_every_rank_said(second, (
            f"--model_dir={model_dir} is in use by another run (host {holder['host']}, pid "
            f"{holder['pid']}, started {holder['started_utc']}); wait for it to end, or use "
            "another --model_dir"))
        assert snapshot(model_dir) == before, "the refused job wrote to model_dir"
    finally:
        go_file.touch()
        stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stdout + stderr
    assert_bitwise_equal(final_weights(model_dir), reference)
    starts = json.loads((model_dir / "config.json").read_text())["starts"]
    assert [start["resumed_after_epoch"] for start in starts] == [None]  # the first job's only
    assert not (model_dir / ownership.LOCK_FILE).exists()


def test_resume_after_rank_0_died_takes_the_model_dir_over_naming_it(tiny_data_dir, tmp_path,
                                                                      reference):
    killed = run(tiny_data_dir, tmp_path, fault="kill_before_step:0:8", timeout=90)
    assert "Process 0 exit with status code 137." in killed.stdout, killed.stdout + killed.stderr
    holder = lock_holder(tmp_path)  # left behind by the dead rank 0, lock and all gone

    resumed = run(tiny_data_dir, tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (f"[0]<stdout>:{tmp_path} was held by a run that ended without releasing it (host "
            f"{holder['host']}, pid {holder['pid']}, started {holder['started_utc']}); this "
            "run takes it over\n") in resumed.stdout
    assert "resuming after epoch 1" in resumed.stdout
    assert_bitwise_equal(final_weights(tmp_path), reference)
    assert not (tmp_path / ownership.LOCK_FILE).exists()
