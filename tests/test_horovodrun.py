"""End-to-end: real `horovodrun -np 2` jobs on the tiny dataset, each with a timeout."""

import json
import os
import shutil
import subprocess
import time

import pytest

from conftest import (TINY_TEST, assert_each_rank_said, assert_every_rank_said,
                      assert_no_rank_traceback, assert_some_rank_said, flip_middle_4k,
                      horovodrun, load_weights, max_abs_difference, snapshot, trainer_command,
                      truncate_half)

pytestmark = pytest.mark.horovodrun

QUICK = ["--batch_size=16", "--log_every=5", "--noexport"]  # export: test_run_outputs.py


def test_two_ranks_end_identical_and_only_rank_0_writes(tiny_data_dir, tmp_path):
    # Each rank runs in its own directory with a relative --model_dir, so files
    # written by rank 1 would show up under rank1/ instead of hiding in rank 0's.
    for rank in (0, 1):
        (tmp_path / f"rank{rank}").mkdir()
    in_rank_dir = ["sh", "-c", 'cd "$0/rank$HOROVOD_RANK" && exec "$@"', str(tmp_path)]
    result = horovodrun(2, in_rank_dir + trainer_command(
        f"--data_dir={tiny_data_dir}", "--model_dir=model", "--epochs=2", *QUICK,
        f"--export_weights_dir={tmp_path / 'weights'}"))
    assert result.returncode == 0, result.stdout + result.stderr

    checkpoints = sorted(os.listdir(tmp_path / "rank0/model/checkpoints"))
    assert "ckpt-2.index" in checkpoints and "checkpoint" in checkpoints
    assert not (tmp_path / "rank1/model").exists(), "rank 1 wrote to its model_dir"

    rank0 = load_weights(tmp_path / "weights/weights_rank0.npz")
    rank1 = load_weights(tmp_path / "weights/weights_rank1.npz")
    assert max_abs_difference(rank0, rank1) == 0.0

    summary = json.loads((tmp_path / "rank0/model/summary.json").read_text())
    assert summary["num_workers"] == 2 and summary["epochs_run"] == 2
    assert summary["test_examples"] == TINY_TEST
    assert summary["train_step_traces"] == 1
    assert len(summary["peak_rss_mib_per_rank"]) == 2
    assert summary["timing"]["first_step_unix_time"] <= summary["timing"]["last_step_unix_time"]
    assert result.stdout.count("final test loss") == 1, "only rank 0 may print"


@pytest.mark.long
def test_resume_continues_at_the_next_epoch(tiny_data_dir, tmp_path):
    common = [f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}", *QUICK]
    first = horovodrun(2, trainer_command(*common, "--epochs=1"))
    assert first.returncode == 0, first.stdout + first.stderr

    resumed = horovodrun(2, trainer_command(*common, "--epochs=2", "--resume"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after epoch 1" in resumed.stdout
    assert "epoch 1/2" not in resumed.stdout and "epoch 2/2" in resumed.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["first_epoch"], summary["epochs_run"]) == (2, 1)
    assert os.path.exists(tmp_path / "checkpoints/ckpt-2.index")


def test_resume_without_checkpoint_starts_fresh_and_says_so(tiny_data_dir, tmp_path):
    result = horovodrun(2, trainer_command(f"--data_dir={tiny_data_dir}",
                                           f"--model_dir={tmp_path}", "--epochs=1",
                                           "--max_steps_per_epoch=2", "--resume", *QUICK))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no checkpoint in" in result.stdout and "starting fresh" in result.stdout


def test_bad_flag_stops_the_job_naming_the_flag(tmp_path):
    result = horovodrun(2, trainer_command("--batch_size=-1"), timeout=60)
    assert result.returncode != 0
    assert "flag --batch_size=-1: -1 is not a positive integer" in result.stdout + result.stderr
    assert_no_rank_traceback(result.stdout + result.stderr)


def test_global_batch_not_divisible_stops_every_rank(tiny_data_dir, tmp_path):
    result = horovodrun(3, trainer_command(f"--data_dir={tiny_data_dir}",
                                           f"--model_dir={tmp_path}", "--global_batch_size=64"),
                        timeout=90)
    assert_every_rank_said(result, "--global_batch_size=64 is not divisible by the 3 workers; "
                           "choose a multiple of 3", num_ranks=3)
    assert not (tmp_path / "checkpoints").exists()


def test_missing_data_stops_the_job_before_horovod_starts(tmp_path):
    # Found before Horovod starts: each rank stops alone, and horovodrun may end the
    # slower one before it speaks (conftest.assert_some_rank_said).
    result = horovodrun(2, trainer_command(f"--data_dir={tmp_path}/nonexistent",
                                           f"--model_dir={tmp_path}/model"), timeout=90)
    assert_some_rank_said(result, (
        f"no prepared TFDS mnist 3.0.1 in '{tmp_path}/nonexistent'; prepare it with: make data "
        f"(or: python -m hvd_mnist.prepare --data_dir={tmp_path}/nonexistent)"))
    assert not (tmp_path / "model").exists()


def test_a_worker_shell_that_ended_by_itself_is_ended_without_a_traceback(monkeypatch):
    # When one worker fails, horovodrun ends every worker's shell, and another shell may
    # have just ended by itself (every rank failing alike, as in the test above): psutil 6+
    # then raises NoSuchProcess for its children (tools/horovod-patches/launcher-gone-shell.patch
    # takes such a shell as one without children).
    import psutil
    from horovod.runner.common.util import safe_shell_exec

    shell = subprocess.Popen(["true"])
    while psutil.Process(shell.pid).status() != psutil.STATUS_ZOMBIE:  # ended, not reaped
        time.sleep(0.01)

    def ended(process, recursive=False):
        raise psutil.NoSuchProcess(process.pid)

    monkeypatch.setattr(psutil.Process, "children", ended)
    safe_shell_exec.terminate_executor_shell_and_children(shell.pid)  # raises unpatched
    assert not psutil.pid_exists(shell.pid)  # and the shell is reaped, as before


def run_on_damaged_data(data_dir, tmp_path, damage, damaged_file, *flags):
    """A job on a copy of data_dir with one file damaged, resuming in a model_dir an earlier
    run left; returns (the job, the copy, whether model_dir changed)."""
    damaged = tmp_path / "tfds"
    shutil.copytree(data_dir, damaged)
    damage(damaged / damaged_file)
    model_dir = tmp_path / "model"  # what an earlier run left behind must stay as it was
    (model_dir / "checkpoints").mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    (model_dir / "checkpoints/checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    before = snapshot(model_dir)
    result = horovodrun(2, trainer_command(f"--data_dir={damaged}", f"--model_dir={model_dir}",
                                           "--resume", *flags), timeout=90)
    return result, damaged, snapshot(model_dir) != before


def test_damaged_dataset_stops_every_rank_and_changes_nothing(tiny_data_dir, tmp_path):
    result, damaged, changed = run_on_damaged_data(
        tiny_data_dir, tmp_path, truncate_half, "mnist/3.0.1/mnist-train.tfrecord-00000-of-00001")
    # The decoded copy (data/decoded.py) no longer matches the damaged file.
    assert_every_rank_said(result, (
        f"the decoded copy in {damaged}/hvd_mnist_decoded/mnist-3.0.1 does not match the TFDS "
        "files it was made from (train split changed since); make it again with: make data "
        f"(or: python -m hvd_mnist.prepare --data_dir={damaged})"))
    assert not changed


def test_damaged_decoded_copy_stops_every_rank_and_changes_nothing(tiny_data_dir, tmp_path):
    images = "hvd_mnist_decoded/mnist-3.0.1/train-images.tensor"
    result, damaged, changed = run_on_damaged_data(tiny_data_dir, tmp_path, flip_middle_4k,
                                                   images)
    assert_every_rank_said(result, (
        f"{damaged}/{images} is damaged (its sha256 is not the one recorded when it was "
        "written); make the decoded copy again with: make data (or: python -m "
        f"hvd_mnist.prepare --data_dir={damaged})"))
    assert not changed


def test_truncated_record_file_stops_every_rank_under_stream_input(tiny_data_dir, tmp_path):
    record = "mnist/3.0.1/mnist-train.tfrecord-00000-of-00001"
    size = os.path.getsize(os.path.join(tiny_data_dir, record))
    result, damaged, changed = run_on_damaged_data(tiny_data_dir, tmp_path, truncate_half,
                                                   record, "--input=stream")
    assert_every_rank_said(result, (
        f"{damaged}/{record} is damaged ({size // 2} bytes, {size} when it was written); "
        f"prepare it again with: make data (or: python -m hvd_mnist.prepare "
        f"--data_dir={damaged})"))
    assert not changed


def test_damaged_record_file_of_one_rank_stops_every_rank_under_files_input(
        tiny_sharded_data_dir, tmp_path):
    record = "mnist/3.0.1/mnist-train.tfrecord-00001-of-00004"  # rank 1 reads files 1 and 3
    result, damaged, changed = run_on_damaged_data(
        tiny_sharded_data_dir, tmp_path, flip_middle_4k, record, "--input=files",
        "--batch_size=16")
    error = (f"{damaged}/{record} is damaged (its sha256 is not the one recorded when it was "
             "written); prepare it again with: make data (or: python -m hvd_mnist.prepare "
             f"--data_dir={damaged})")
    assert_each_rank_said(result, [f"rank 1: {error}", error])
    assert not changed


# fit's stop is the same hooks.RunHooks.end_epoch decision; its job runs in make test-long.
@pytest.mark.parametrize("mode", ["custom", pytest.param("keras", marks=pytest.mark.long)])
def test_target_accuracy_stops_training_early(tiny_data_dir, tmp_path, mode):
    result = horovodrun(2, trainer_command(
        f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}", f"--mode={mode}",
        "--epochs=6", "--target_accuracy=0.5", *QUICK))
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epochs_run"] < 6 and summary["test_accuracy"] >= 0.5
    assert all(r["test_accuracy"] < 0.5 for r in summary["history"][:-1])
    assert "reached --target_accuracy=0.5" in result.stdout
