"""Two hosts for real: horovodrun across network namespaces made by tools/hosts.sh.

Each host is a network namespace with its own address, /etc/hosts, hostname and
sshd; horovodrun starts inside hostA, as on a cluster where one launches from a
node, and reaches hostB over ssh. Without root (or iproute2, openssh-server)
every test here skips and says why.
"""

import json
import os
import subprocess
import threading
import time

import pytest

from conftest import (BIN_DIR, HOROVOD_TEST_ENV, horovodrun, load_weights, max_abs_difference,
                      trainer_command)
from host_bed import BED_ENV, HOSTS_TOOL, SSH_KEY, SSH_PORT, hosts_tool, two_hosts  # noqa: F401
from hvd_mnist.verification import launch

pytestmark = [pytest.mark.horovodrun, pytest.mark.hosts]

SSH = {"ssh_port": int(SSH_PORT), "ssh_identity_file": SSH_KEY, "network_interface": "eth0",
       "disable_cache": True}  # else a stopped sshd hides behind an hour-old "reachable"
# One thread per rank on both sides: by default a rank alone on its host takes
# both cores, and a different thread count sums in another order (3e-7 apart).
QUICK = ["--epochs=2", "--max_steps_per_epoch=4", "--batch_size=16", "--log_every=1",
         "--deterministic", "--threads_per_rank=1"]


def on_hosts(hosts, np_, args, timeout=180, controller="gloo"):
    """horovodrun -np N -H <hosts> started inside hostA; returns the completed process."""
    return subprocess.run(launch_command(hosts, np_, args, controller), capture_output=True,
                          text=True, timeout=timeout, env=launch_env())


def launch_command(hosts, np_, args, controller="gloo"):
    return [HOSTS_TOOL, "exec", "hostA", *launch.horovodrun_command(
        np_, args, hosts=hosts, flags=launch.options(controller, **SSH))]


def launch_env():
    return launch.environment({**HOROVOD_TEST_ENV, **BED_ENV})


def per_host_dirs(root, *command):
    """command run in root/<hostname>: a relative --model_dir is then each host's own disk."""
    return ["sh", "-c", 'cd "$0/$(hostname)" && exec "$@"', str(root), *command]


def weights(directory):
    return [load_weights(f"{directory}/weights_rank{rank}.npz") for rank in (0, 1)]


@pytest.fixture(scope="module")
def one_host_weights(tiny_data_dir, tmp_path_factory):
    """Final weights of each mode at -np 2 on one host (this machine, localhost:2)."""
    result = {}
    for mode in ("custom", "keras"):
        out = tmp_path_factory.mktemp(f"one_host_{mode}")
        run = horovodrun(2, trainer_command(f"--data_dir={tiny_data_dir}",
                                            f"--model_dir={out}/model", f"--mode={mode}",
                                            f"--export_weights_dir={out}/weights", *QUICK))
        assert run.returncode == 0, run.stdout + run.stderr
        result[mode] = weights(out / "weights")
    return result


@pytest.mark.parametrize("mode", ["custom", "keras"])
def test_across_two_hosts_weights_are_bitwise_those_of_one_host(
        two_hosts, tiny_data_dir, tmp_path, one_host_weights, mode):
    run = on_hosts("hostA:1,hostB:1", 2, trainer_command(
        f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}/model", f"--mode={mode}",
        f"--export_weights_dir={tmp_path}/weights", *QUICK))
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((tmp_path / "model/summary.json").read_text())
    assert [r["host"] for r in summary["ranks"]] == ["hostA", "hostB"]
    across_hosts = weights(tmp_path / "weights")
    assert max_abs_difference(*across_hosts) == 0.0, "the ranks disagree"
    for rank in (0, 1):
        assert max_abs_difference(across_hosts[rank], one_host_weights[mode][rank]) == 0.0


def test_two_hosts_two_workers_each_and_resume_with_model_dir_on_host_a(
        two_hosts, tiny_data_dir, tmp_path):
    for host in ("hostA", "hostB"):
        (tmp_path / host).mkdir()
    common = [f"--data_dir={tiny_data_dir}", "--model_dir=model", "--max_steps_per_epoch=2",
              "--batch_size=16", "--log_every=1"]
    first = on_hosts("hostA:2,hostB:2", 4, per_host_dirs(tmp_path, *trainer_command(
        *common, "--epochs=1")))
    assert first.returncode == 0, first.stdout + first.stderr
    summary = json.loads((tmp_path / "hostA/model/summary.json").read_text())
    # Ranks fill hostA's slots first; local rank and size count per host, and
    # each rank took its host's 2 cores / 2 local ranks = 1 thread.
    assert [(r["rank"], r["host"], r["local_rank"], r["local_size"], r["threads_per_rank"])
            for r in summary["ranks"]] == [
        (0, "hostA", 0, 2, 1), (1, "hostA", 1, 2, 1),
        (2, "hostB", 0, 2, 1), (3, "hostB", 1, 2, 1)]

    resumed = on_hosts("hostA:2,hostB:2", 4, per_host_dirs(tmp_path, *trainer_command(
        *common, "--epochs=2", "--resume")))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after epoch 1" in resumed.stdout
    summary = json.loads((tmp_path / "hostA/model/summary.json").read_text())
    assert (summary["first_epoch"], summary["epochs_run"]) == (2, 1)
    assert (tmp_path / "hostA/model/checkpoints/ckpt-2.index").exists()
    assert not (tmp_path / "hostB/model").exists(), "a rank on hostB wrote a model_dir"


def test_a_cut_link_ends_the_job_within_60_s_naming_the_lost_rank(
        two_hosts, tiny_data_dir, tmp_path):
    job = subprocess.Popen(
        launch_command("hostA:1,hostB:1", 2, trainer_command(
            f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}", "--epochs=1000",
            "--batch_size=16", "--log_every=1")),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=launch_env())
    lines, training = [], threading.Event()

    def read_output():
        for line in job.stdout:
            lines.append(line)
            if line.split("]<stdout>:")[-1].startswith("epoch 2/"):
                training.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        assert training.wait(timeout=180), "training never started:\n" + "".join(lines)
        hosts_tool("link", "hostB", "down")
        cut = time.monotonic()
        returncode = job.wait(timeout=120)
        seconds = time.monotonic() - cut
    finally:
        if job.poll() is None:
            job.kill()
        hosts_tool("link", "hostB", "up")
    reader.join(timeout=10)
    output = "".join(lines)
    print(f"link cut to exit: {seconds:.1f} s\n{output[-3000:]}")
    assert returncode != 0, output
    assert seconds < 60, f"took {seconds:.0f} s:\n{output}"
    # The ssh session to hostB ends after its keep-alives go unanswered (15 s),
    # and horovodrun names the rank it ran: "Process 1" is rank 1.
    assert "Process 1 exit with status code 255." in output, output
    assert "Terminating remaining workers after failure of Process 1." in output, output


def test_a_host_without_sshd_is_named_by_the_launcher_within_60_s(two_hosts, tiny_data_dir,
                                                                     tmp_path):
    hosts_tool("sshd", "hostB", "stop")
    try:
        started = time.monotonic()
        run = on_hosts("hostA:1,hostB:1", 2, trainer_command(
            f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}", *QUICK), timeout=120)
        seconds = time.monotonic() - started
    finally:
        hosts_tool("sshd", "hostB", "start")
    output = run.stdout + run.stderr
    print(f"launch to exit: {seconds:.1f} s\n{output}")
    assert run.returncode != 0 and seconds < 60, output
    assert "ssh not successful for host hostB" in output, output
    assert "Connection refused" in output, output
    assert "training on" not in output


def mpi_built():
    report = subprocess.run([os.path.join(BIN_DIR, "horovodrun"), "--check-build"],
                            capture_output=True, text=True).stdout
    return "[X] MPI" in report


@pytest.mark.skipif(not mpi_built(), reason="Horovod was built without MPI (make setup MPI=1)")
def test_across_two_hosts_with_mpi_weights_are_bitwise_those_of_one_host(
        two_hosts, tiny_data_dir, tmp_path, one_host_weights):
    run = on_hosts("hostA:1,hostB:1", 2, trainer_command(
        f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path}/model",
        f"--export_weights_dir={tmp_path}/weights", *QUICK), controller="mpi")
    assert run.returncode == 0, run.stdout + run.stderr
    across_hosts = weights(tmp_path / "weights")
    assert max_abs_difference(*across_hosts) == 0.0, "the ranks disagree"
    for rank in (0, 1):
        assert max_abs_difference(across_hosts[rank], one_host_weights["custom"][rank]) == 0.0
