"""Elastic training (--elastic) on real elastic horovodrun jobs: a worker lost, a worker
joining, a kill during a commit or a checkpoint save, no difference when nothing fails,
and --resume from an elastic run's checkpoint.

tests/elastic_jobs.py starts the jobs and reads back every process's --example_log:
per epoch, every example must be trained exactly once by the steps that were kept, and
only steps after the last commit may be rolled back and re-done.

`make test` keeps the refusals and the run without failures; the fault jobs, a minute each
on the slower CPUs, are marked long (make test-long, which .ci/run runs).
"""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import TINY_TRAIN, horovodrun, load_weights, max_abs_difference, trainer_command
from tensorboard_events import read_scalars
from elastic_jobs import (FLAGS, HOSTS, assert_every_example_once_per_epoch,
                          assert_export_reproduces_the_accuracy,
                          assert_finished_like_a_normal_run, finish, log_records,
                          read_example_log, start_elastic, wait_for, write_hosts)


@pytest.mark.parametrize("flags,message", [
    (["--mode=keras"], "--elastic is supported by --mode=custom only"),
    (["--recipe=fast"], "hvd_mnist: error: --elastic needs --lr_schedule=constant"),
    (["--input=stream"], "hvd_mnist: error: --elastic needs --input=memory"),
])
def test_unsupported_combinations_are_refused_in_one_line(tiny_data_dir, flags, message):
    result = subprocess.run(trainer_command(f"--data_dir={tiny_data_dir}", "--elastic", *flags),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and message in result.stderr, result.stderr



@pytest.mark.horovodrun
@pytest.mark.long
def test_a_lost_worker_is_dropped_and_its_uncommitted_steps_redone(tiny_data_dir, tmp_path):
    hosts = tmp_path / "hosts"
    write_hosts(hosts, HOSTS)
    job = start_elastic(tiny_data_dir, tmp_path, hosts, "--epochs=3", "--log_every=5",
                        "--progress=lines", fault="slow_until_size:1:500")
    # Mid-epoch 2, after step 5 (commits follow steps 4 and 8), kill rank 1.
    victim = wait_for(lambda logs: next(
        (pid for pid, rs in logs.items() for r in rs
         if "step" in r and r["rank"] == 1 and r["epoch"] == 2 and r["position"] == 4 * 32),
        None), tmp_path, job)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    # The failed host is blacklisted; take it out of the file only once the job has
    # re-formed without it (docs/elastic.md, on a race in Horovod's driver).
    # Its host, not a fixed one: the driver puts rank 1 on either (hash order).
    wait_for(lambda logs: any(r.get("start") == 2 for rs in logs.values() for r in rs),
             tmp_path, job)
    victim_host = next(r["host"] for r in log_records(tmp_path)[victim] if "start" in r)
    survivors = [h for h in HOSTS if h.split(":")[0] != victim_host]
    assert len(survivors) == 1, victim_host
    write_hosts(hosts, survivors)
    returncode, output = finish(job, tmp_path)
    assert returncode == 0, output
    # First, as exit 0 does not prove it: a driver that gives up waiting for hosts
    # ends the job with exit 0 (Horovod 0.28.1).
    summary = assert_finished_like_a_normal_run(tmp_path, epochs=3, num_workers=1)
    assert_export_reproduces_the_accuracy(tmp_path, summary, tiny_data_dir)
    # Progress and TensorBoard as in a normal run, across the resize: epoch 2 is 4 steps
    # at 2 workers, then the rest (352 examples) in 22 steps of 16 at 1; epoch 3 is 30.
    assert "epoch 1/3 step 15/15: loss" in output and "epoch 3/3 step 30/30: loss" in output
    scalars = read_scalars(str(tmp_path / "tensorboard"))
    assert [step for step, _ in scalars["epoch/test_accuracy"]] == [1, 2, 3]
    assert max(step for step, _ in scalars["train/loss"]) == 15 + 26 + 30

    kept, redone, starts = read_example_log(tmp_path)
    assert [r["size"] for n in sorted(starts) for r in starts[n]] == [2, 2, 1]
    assert starts[2][0]["epoch"] == 2
    assert_every_example_once_per_epoch(kept, epochs=3)
    # The steps after the last commit (position 4 x 32) were trained, lost and re-done.
    assert starts[2][0]["position"] == 4 * 32
    rolled_back = {(r["rank"], r["position"]) for r in redone[2]}
    assert {(rank, 4 * 32) for rank in (0, 1)} <= rolled_back
    assert all(4 * 32 <= r["position"] < 8 * 32 for r in redone[2])
    redone_examples = {i for r in redone[2] for i in r["examples"]}
    kept_after = {i for r in kept[2] if r["step"] == 2 for i in r["examples"]}
    assert redone_examples <= kept_after
    first_commit = min(r["unix_time"] for rs in log_records(tmp_path).values() for r in rs
                       if r.get("commit") == 2)
    print(f"\nSIGKILL to the first commit at 1 worker: {first_commit - killed_at:.1f} s")
    assert "elastic: start 2 on 1 worker(s) at epoch 2, example 128 of 480" in output


@pytest.mark.horovodrun
@pytest.mark.long
def test_a_joining_worker_starts_from_rank_0s_state(tiny_data_dir, tmp_path):
    hosts = tmp_path / "hosts"
    write_hosts(hosts, HOSTS[:1])
    job = start_elastic(tiny_data_dir, tmp_path, hosts, "--epochs=4", np_=1,
                        fault="slow_until_size:2:300")
    wait_for(lambda logs: any("step" in r for rs in logs.values() for r in rs), tmp_path, job)
    write_hosts(hosts, HOSTS)
    returncode, output = finish(job, tmp_path)
    assert returncode == 0, output

    kept, redone, starts = read_example_log(tmp_path)
    assert len(starts[1]) == 1 and all(len(starts[n]) == 2 for n in sorted(starts)[1:])
    joined = starts[2]
    assert {r["rank"] for r in joined} == {0, 1} and {r["size"] for r in joined} == {2}
    assert joined[0]["weights"] == joined[1]["weights"], "the new worker has other weights"
    assert not any(redone.values()), "growing must not roll anything back"
    assert_every_example_once_per_epoch(kept, epochs=4)
    after = [r for steps in kept.values() for r in steps if r["step"] == 2]
    assert {r["rank"] for r in after} == {0, 1} and all(len(r["examples"]) <= 16 for r in after)
    assert_finished_like_a_normal_run(tmp_path, epochs=4, num_workers=2)
    final = [load_weights(tmp_path / f"weights/weights_rank{rank}.npz") for rank in (0, 1)]
    assert max_abs_difference(*final) == 0.0


@pytest.mark.horovodrun
def test_without_failures_elastic_equals_a_normal_run_bitwise(tiny_data_dir, tmp_path):
    flags = ["--epochs=2", "--max_steps_per_epoch=6", "--deterministic"]
    hosts = tmp_path / "hosts"
    write_hosts(hosts, HOSTS)
    (tmp_path / "elastic").mkdir()
    job = start_elastic(tiny_data_dir, tmp_path / "elastic", hosts, *flags)
    normal = horovodrun(2, trainer_command(
        f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}/normal",
        f"--export_weights_dir={tmp_path}/normal/weights", *FLAGS, *flags), timeout=420)
    assert normal.returncode == 0, normal.stdout + normal.stderr
    returncode, output = finish(job, tmp_path / "elastic")
    assert returncode == 0, output
    for rank in (0, 1):
        elastic_weights = load_weights(tmp_path / f"elastic/weights/weights_rank{rank}.npz")
        normal_weights = load_weights(tmp_path / f"normal/weights/weights_rank{rank}.npz")
        assert max_abs_difference(elastic_weights, normal_weights) == 0.0, f"rank {rank}"
    summaries = [json.loads((tmp_path / f"{run}/summary.json").read_text())
                 for run in ("elastic", "normal")]
    assert summaries[0]["test_accuracy"] == summaries[1]["test_accuracy"]
    assert summaries[0]["steps"] == summaries[1]["steps"] == 12


@pytest.mark.horovodrun
@pytest.mark.long
def test_resume_continues_an_elastic_runs_checkpoint_exactly(tiny_data_dir, tmp_path):
    flags = ["--max_steps_per_epoch=6", "--deterministic"]
    hosts = tmp_path / "hosts"
    write_hosts(hosts, HOSTS)
    job = start_elastic(tiny_data_dir, tmp_path, hosts, "--epochs=1", *flags)
    normal = horovodrun(2, trainer_command(
        f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}/normal",
        f"--export_weights_dir={tmp_path}/normal/weights", *FLAGS, "--epochs=2", *flags),
        timeout=420)
    assert normal.returncode == 0, normal.stdout + normal.stderr
    returncode, output = finish(job, tmp_path)
    assert returncode == 0, output
    assert_finished_like_a_normal_run(tmp_path, epochs=1, num_workers=2)

    job = start_elastic(tiny_data_dir, tmp_path, hosts, "--epochs=2", "--resume", *flags)
    returncode, output = finish(job, tmp_path)
    assert returncode == 0, output
    assert "resuming after epoch 1" in output and "epoch 1/2" not in output
    assert_finished_like_a_normal_run(tmp_path, epochs=2, num_workers=2, first_epoch=2)
    _, _, starts = read_example_log(tmp_path)  # both runs': one start each, no reset
    assert sorted(starts) == [1]
    assert sorted((r["epoch"], r["position"]) for r in starts[1]) == [(1, 0)] * 2 + [(2, 0)] * 2
    for rank in (0, 1):
        resumed = load_weights(tmp_path / f"weights/weights_rank{rank}.npz")
        uninterrupted = load_weights(tmp_path / f"normal/weights/weights_rank{rank}.npz")
        assert max_abs_difference(resumed, uninterrupted) == 0.0, f"rank {rank}"


@pytest.mark.horovodrun
@pytest.mark.long
def test_a_worker_lost_in_a_commit_loses_nothing_committed(tiny_data_dir, tmp_path):
    hosts = tmp_path / "hosts"
    write_hosts(hosts, HOSTS)
    # Rank 1's 3rd commit is the one after step 12 of epoch 1.
    job = start_elastic(tiny_data_dir, tmp_path, hosts, "--epochs=2",
                        fault="kill_in_commit:1:3")
    returncode, output = finish(job, tmp_path)
    assert returncode == 0, output
    kept, redone, starts = read_example_log(tmp_path)
    assert starts[2][0]["size"] == 1
    assert (starts[2][0]["epoch"], starts[2][0]["position"]) == (1, 12 * 32)
    assert not any(redone.values()), "committed steps were trained again"
    assert_every_example_once_per_epoch(kept, epochs=2)
    assert_finished_like_a_normal_run(tmp_path, epochs=2, num_workers=1)


@pytest.mark.horovodrun
@pytest.mark.long
def test_rank_0_lost_in_a_checkpoint_save_the_new_rank_0_writes_it(tiny_data_dir, tmp_path):
    hosts = tmp_path / "hosts"
    write_hosts(hosts, HOSTS)
    job = start_elastic(tiny_data_dir, tmp_path, hosts, "--epochs=3", fault="kill_in_save:2")
    returncode, output = finish(job, tmp_path)
    assert returncode == 0, output
    kept, redone, starts = read_example_log(tmp_path)
    # Restarted at the end of epoch 2's steps, committed before the save: nothing re-done.
    assert (starts[2][0]["size"], starts[2][0]["epoch"]) == (1, 2)
    assert starts[2][0]["position"] == TINY_TRAIN
    assert not any(redone.values())
    assert_every_example_once_per_epoch(kept, epochs=3)
    assert (tmp_path / "checkpoints/ckpt-2.index").exists()
    assert_finished_like_a_normal_run(tmp_path, epochs=3, num_workers=1)
    # The model_dir's lock died with the first rank 0; the new one took it (ownership.py).
    assert f"{tmp_path}: rank 0 moved here from host " in output
    assert not (tmp_path / "owner.lock").exists()
