"""Slurm for real: deploy/slurm/train.sbatch submitted to a Slurm cluster on the test bed.

tools/slurm/bed.sh runs slurmctld on hostA and a slurmd in each host's namespace (see
tests/test_hosts.py for the hosts); the tests submit from hostA as a user would from a
login node: 2 nodes x 1 worker on test_faults.py's deterministic flags (3 epochs of 5
steps), whose final weights must be bitwise those of the same run at -np 2 on one host.
Without root, network namespaces or Slurm (`make setup MPI=1` installs it as root) every
test here skips and says why.
"""

import json
import os
import time

import pytest
import tensorflow as tf

import test_faults
from conftest import HOROVOD_TEST_ENV, WITH_AIDS, max_abs_difference
from slurm_bed import SlurmBed
from test_faults import assert_bitwise_equal, final_weights
from test_preemption import processes_naming

pytestmark = [pytest.mark.horovodrun, pytest.mark.hosts]

# One thread per rank on both sides, as in test_hosts.py: a rank alone on its host would
# otherwise take both cores and sum in another order.
FLAGS = [*test_faults.FLAGS, "--threads_per_rank=1"]
# Rank 0 waits before its step 11 (epoch 3, step 1) until it has a signal, so a test acts
# on a job that is surely mid-run. Signalled there, every rank stops after step 13 and
# rank 0 saves mid_epoch/step-13; a resumed run's 2 steps never reach an 11th.
HELD_BEFORE_STEP_11 = "wait_for_signal_before_step:11:0"
SAVED = "checkpoints/mid_epoch/step-13"


@pytest.fixture(scope="module")
def bed():
    """hostA and hostB as one Slurm cluster, removed again however the tests end."""
    bed = SlurmBed(prefix=f"hvs{os.getpid()}", subnet="10.78.0", ssh_port=2223)
    reason = bed.cannot_run_here()
    if reason:
        pytest.skip(f"no Slurm test bed: {reason}")
    try:
        bed.up(2)
        yield bed
    finally:
        bed.down()


@pytest.fixture
def idle_bed(bed):
    bed.wait_until_idle()  # the previous test's job and nodes settled
    return bed


@pytest.fixture(scope="module")
def reference(tiny_data_dir, tmp_path_factory):
    """Final weights of the uninterrupted run at -np 2 on this machine (localhost:2)."""
    model_dir = tmp_path_factory.mktemp("one_host")
    result = test_faults.run(tiny_data_dir, model_dir, "--threads_per_rank=1")
    assert result.returncode == 0, result.stdout + result.stderr
    return final_weights(model_dir)


def settings(tiny_data_dir, model_dir, *extra_flags, fault=None):
    """The batch script's settings (its environment at submission) for one job."""
    values = {"HVD_MNIST_DATA_DIR": tiny_data_dir, "HVD_MNIST_MODEL_DIR": str(model_dir),
              "HVD_MNIST_FLAGS": " ".join(
                  [*FLAGS, f"--export_weights_dir={model_dir}/weights", *extra_flags]),
              # --export_weights_dir is a testing aid: the job runs tests/with_aids.py.
              "HVD_MNIST_PROGRAM": WITH_AIDS, **HOROVOD_TEST_ENV}
    if fault:
        values.update(HVD_MNIST_PROGRAM=test_faults.WITH_FAULT, HVD_MNIST_TEST_FAULT=fault,
                      HVD_MNIST_TEST_GO_FILE=f"{model_dir}/go")
    return values


def job_output(workdir, job_id):
    path = workdir / f"slurm-{job_id}.out"
    return path.read_text() if path.exists() else ""


def wait_until_held(bed, job_id, model_dir, workdir):
    """Until rank 0 waits before step 11 (it has written its pid)."""
    waiting, deadline = model_dir / "go.waiting0", time.monotonic() + 240
    while not (waiting.exists() and waiting.read_text()):
        state = bed.job(job_id)["JobState"]
        assert state in ("PENDING", "RUNNING") and time.monotonic() < deadline, (
            f"job {job_id} {state}, never held:\n{job_output(workdir, job_id)}")
        time.sleep(0.5)


def wait_until_gone(bed, job_id, model_dir, deadline):
    """Until Slurm has ended the job and no process on any host runs for it; its state."""
    while True:
        job = bed.job(job_id)
        if job["JobState"] in bed.ENDED and not processes_naming(str(model_dir)):
            return job
        if time.monotonic() > deadline:
            return job
        time.sleep(0.5)


def assert_latest_checkpoints_whole(model_dir):
    """Each kind's latest checkpoint reads back in full; no partial save is left."""
    latest = [tf.train.latest_checkpoint(model_dir / kind)
              for kind in ("checkpoints", "checkpoints/mid_epoch")]
    assert any(latest), f"no checkpoint in {model_dir}"
    for path in filter(None, latest):
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    assert not list(model_dir.glob("checkpoints/**/*_temp*")), "a partial save was left"


def test_a_two_node_batch_job_ends_with_bitwise_the_weights_of_one_host(
        idle_bed, tiny_data_dir, tmp_path, reference):
    model_dir = tmp_path / "model"
    job_id = idle_bed.sbatch(tmp_path, settings(tiny_data_dir, model_dir))
    job = idle_bed.wait_for_job(job_id)
    output = job_output(tmp_path, job_id)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), output
    assert f"hvd_mnist: job {job_id} (restart 0) on hostA:1,hostB:1," in output
    summary = json.loads((model_dir / "summary.json").read_text())
    assert [r["host"] for r in summary["ranks"]] == ["hostA", "hostB"]
    weights = final_weights(model_dir)
    assert max_abs_difference(*weights) == 0.0, "the ranks disagree"
    assert_bitwise_equal(weights, reference)


@pytest.mark.parametrize("how", ["scontrol requeue", "time limit near"])
def test_a_requeued_job_resumes_from_its_checkpoint_and_ends_as_the_uninterrupted_run(
        idle_bed, tiny_data_dir, tmp_path, reference, how):
    model_dir = tmp_path / "model"
    job_id = idle_bed.sbatch(tmp_path, settings(tiny_data_dir, model_dir,
                                                fault=HELD_BEFORE_STEP_11))
    wait_until_held(idle_bed, job_id, model_dir, tmp_path)
    if how == "scontrol requeue":
        # As preemption does: SIGTERM to every process of the job on hostA, rank 0 among
        # them; Slurm requeues the job itself.
        idle_bed.on_controller("scontrol", "requeue", job_id)
    else:
        # What #SBATCH --signal=B:USR1@120 sends: the batch shell alone, which stops the
        # workers and requeues the job.
        idle_bed.on_controller("scancel", "--batch", "--signal=USR1", job_id)
    job = idle_bed.wait_for_job(job_id)
    output = job_output(tmp_path, job_id)
    assert (job["JobState"], job["Restarts"]) == ("COMPLETED", "1"), output
    saved = f"{model_dir}/{SAVED}"
    assert ("[0]<stderr>:hvd_mnist: preempted (SIGTERM): stopped after step 3 of 5 of epoch 3 "
            f"and saved {saved}; continue with --resume\n") in output, output
    assert f"hvd_mnist: job {job_id} (restart 1) on hostA:1,hostB:1," in output
    assert f"[0]<stdout>:resuming at step 4 of epoch 3 from {saved}\n" in output, output
    assert_bitwise_equal(final_weights(model_dir), reference)


def test_scancel_ends_the_job_within_60_s_leaving_whole_checkpoints(
        idle_bed, tiny_data_dir, tmp_path):
    model_dir = tmp_path / "model"
    job_id = idle_bed.sbatch(tmp_path, settings(tiny_data_dir, model_dir,
                                                fault=HELD_BEFORE_STEP_11))
    wait_until_held(idle_bed, job_id, model_dir, tmp_path)
    idle_bed.on_controller("scancel", job_id)
    cancelled = time.monotonic()
    job = wait_until_gone(idle_bed, job_id, model_dir, deadline=cancelled + 120)
    seconds = time.monotonic() - cancelled
    output = job_output(tmp_path, job_id)
    print(f"scancel to the job's end: {seconds:.1f} s\n{output[-3000:]}")
    assert job["JobState"] == "CANCELLED" and seconds < 60, output
    assert processes_naming(str(model_dir)) == [], "a worker outlived the job"
    # The workers on hostA had Slurm's SIGTERM: every rank stopped and rank 0 saved.
    assert tf.train.latest_checkpoint(model_dir / "checkpoints/mid_epoch") == f"{model_dir}/{SAVED}"
    assert_latest_checkpoints_whole(model_dir)


def test_a_node_cut_off_mid_job_fails_the_job_within_60_s_leaving_whole_checkpoints(
        idle_bed, tiny_data_dir, tmp_path):
    model_dir = tmp_path / "model"
    job_id = idle_bed.sbatch(tmp_path, settings(tiny_data_dir, model_dir, "--epochs=1000"))
    deadline = time.monotonic() + 240
    while "[0]<stdout>:epoch 2/1000:" not in job_output(tmp_path, job_id):
        assert idle_bed.job(job_id)["JobState"] in ("PENDING", "RUNNING"), job_output(
            tmp_path, job_id)
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.5)
    try:
        idle_bed.hosts("link", "hostB", "down")
        cut = time.monotonic()
        job = idle_bed.wait_for_job(job_id, timeout=120)
        seconds = time.monotonic() - cut
    finally:
        idle_bed.hosts("link", "hostB", "up")
    output = job_output(tmp_path, job_id)
    print(f"link cut to the job's end: {seconds:.1f} s\n{output[-3000:]}")
    # FAILED, not requeued: horovodrun fails the job before slurmctld marks hostB down
    # (tools/slurm/bed.sh's SlurmdTimeout); the job's processes on hostA are then gone.
    assert job["JobState"] == "FAILED" and seconds < 60, output
    # horovodrun's ssh session to hostB ends after its keep-alives go unanswered.
    assert "Process 1 exit with status code 255." in output, output
    assert_latest_checkpoints_whole(model_dir)
    # hostB's worker is sshd's child, not Slurm's: Horovod's stall check ends it.
    stall_seconds = int(HOROVOD_TEST_ENV["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
    job = wait_until_gone(idle_bed, job_id, model_dir, deadline=cut + stall_seconds + 60)
    print(f"link cut to hostB's worker gone: {time.monotonic() - cut:.1f} s")
    assert processes_naming(str(model_dir)) == [], "hostB's worker outlived the job"
