"""python -m hvd_mnist.verify: the probe and the whole command on this machine (host lists
and the comparison: test_verification.py), and on the test bed of two hosts (marked
`hosts`): a healthy pair passes, and each planted fault is named in one line, with
model_dir as it was.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import HOROVOD_TEST_ENV, flip_middle_4k, snapshot
from host_bed import (BED_ENV, HOSTS_TOOL, SSH_KEY, SSH_PORT, host_namespace, hosts_tool,
                      on_host_only, two_hosts)  # noqa: F401
from hvd_mnist.verification import agreement, launch, probe, remote



# ---------------------------------------------------------------- the probe, here

def test_the_probe_reports_this_host_and_leaves_model_dir_as_it_was(tiny_data_dir, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    before = snapshot(model_dir)
    answer = remote.ask("localhost", {"question": "facts", "data_dir": tiny_data_dir,
                                      "model_dir": str(model_dir), "interface": "lo"},
                        remote.Ssh(), timeout_seconds=300)
    assert answer["problems"] == []
    assert answer["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert answer["versions"]["tensorflow"] and answer["versions"]["horovod"]
    assert "gloo" in answer["horovod_build"] and answer["address"] == "127.0.0.1"
    assert "train-images.tensor" in answer["data"]
    assert snapshot(model_dir) == before


def test_the_probe_finds_damaged_data_and_an_unwritable_model_dir(tiny_data_dir, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_data_dir, data_dir)
    damaged = next(data_dir.rglob("train-images.tensor"))
    flip_middle_4k(damaged)
    (tmp_path / "file").write_text("")
    problems = []
    probe.data(str(data_dir), problems)
    assert problems == [f"{damaged} is damaged (its sha256 is not the one recorded when it "
                        "was written); prepare it again there with: make data"]
    assert probe.model_dir_problem(str(tmp_path / "file" / "model")) == (
        f"--model_dir={tmp_path}/file/model is not writable ({tmp_path}/file is not a "
        "directory)")
    assert probe.model_dir_problem(str(tmp_path / "not" / "yet")) == ""  # made by the run
    assert probe.reach({"question": "reach", "port": 1, "interface": "",
                        "peers": [["here", "127.0.0.1"]]})["problems"] == [
        "cannot reach here (127.0.0.1) at port 1: Connection refused"]


# 127.0.0.2 is on no interface of this machine, so verify (as horovodrun) takes it for
# another host, and reaches it over ssh; nothing listens at port 1.
NOT_THIS_HOST = "127.0.0.2"


def test_a_host_that_is_not_there_is_named_by_ssh():
    assert not remote.is_local(NOT_THIS_HOST) and remote.is_local("localhost")
    answer = remote.ask(NOT_THIS_HOST, {"question": "reach", "port": 22, "interface": "",
                                        "peers": []}, remote.Ssh(port=1), timeout_seconds=60)
    assert answer == {"problems": [f"cannot run the check over ssh (ssh: connect to host "
                                   f"{NOT_THIS_HOST} port 1: Connection refused)"]}


def test_a_failed_run_is_named_by_its_error_line():
    output = ("[1]<stderr>:hvd_mnist: error: no prepared TFDS mnist 3.0.1 in 'x'\n"
              "Process 1 exit with status code 1.\n")
    assert agreement.failure_reason(output) == "hvd_mnist: error: no prepared TFDS mnist " \
                                               "3.0.1 in 'x'"
    assert agreement.failure_reason("one\ntwo\n\n") == "two"


# ---------------------------------------------------------------- the command, on one host

def verify(*flags, timeout=600):
    return subprocess.run([sys.executable, "-m", "hvd_mnist.verify", *flags],
                          capture_output=True, text=True, timeout=timeout,
                          env=launch.environment(HOROVOD_TEST_ENV))


# make test-hosts runs verify across two hosts; this one-host job is in make test-long.
@pytest.mark.horovodrun
@pytest.mark.long
def test_two_workers_on_this_host_pass_and_model_dir_is_unchanged(tiny_data_dir, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "summary.json").write_text(json.dumps({"test_accuracy": 0.99}))
    before = snapshot(model_dir)
    result = verify("--hosts=localhost:2", f"--data_dir={tiny_data_dir}",
                    f"--model_dir={model_dir}", "--steps=3")
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("verify: largest weight difference ") and last.endswith(": PASS")
    assert "after 3 float64 steps at -np 2 against -np 1" in last
    assert snapshot(model_dir) == before


def test_verify_refuses_to_run_anywhere_but_on_the_first_host(tmp_path):
    result = verify(f"--hosts={NOT_THIS_HOST}:1,localhost:1", f"--model_dir={tmp_path}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"verify: error: run verify on {NOT_THIS_HOST}, the first host of the list: rank 0 runs "
        "there, and verify reads the weights it writes")


def test_the_verdict_passes_within_the_tolerance_only():
    assert agreement.Outcome(2, 5, 3e-17).passed
    assert not agreement.Outcome(2, 5, 2e-9).passed
    assert not agreement.Outcome(2, 5, 0.0, problems=("the run at -np 1 failed",)).passed
    assert agreement.Outcome(2, 5, 2e-9).verdict_line() == (
        "largest weight difference 2e-09 after 5 float64 steps at -np 2 against -np 1 (at most "
        "1e-09): FAIL")


# ---------------------------------------------------------------- on the test bed

def verify_from_host_a(data_dir, model_dir, *flags):
    """verify started inside hostA for hostA:1,hostB:1, as a user would on a cluster."""
    command = [HOSTS_TOOL, "exec", "hostA", sys.executable, "-m", "hvd_mnist.verify",
               "--hosts=hostA:1,hostB:1", f"--data_dir={data_dir}", f"--model_dir={model_dir}",
               f"--ssh_port={SSH_PORT}", f"--ssh_identity_file={SSH_KEY}",
               "--network_interface=eth0", "--steps=3", *flags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900,
                            env=launch.environment({**HOROVOD_TEST_ENV, **BED_ENV}))
    print(result.stdout, result.stderr[-3000:])
    return result


@pytest.fixture
def bed_dirs(tiny_data_dir, tmp_path):
    """A data_dir of this test's own (a host may be given another copy at the same path)
    and a model_dir holding a finished run's files; asserts after the test that model_dir
    is as it was, file for file."""
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_data_dir, data_dir)
    model_dir = tmp_path / "model"
    (model_dir / "checkpoints").mkdir(parents=True)
    (model_dir / "summary.json").write_text(json.dumps({"test_accuracy": 0.99}))
    (model_dir / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    before = snapshot(model_dir)
    yield data_dir, model_dir
    assert snapshot(model_dir) == before, "verify changed model_dir"


def assert_named(result, lines):
    """The planted faults, each one line of its own, then FAIL before any step."""
    output = result.stdout.strip().splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    for line in lines:
        assert any(re.fullmatch(line, said) for said in output), f"no line {line!r}"
    assert output[-1].startswith("verify: FAIL: ") and output[-1].endswith("no steps run")
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.hosts
@pytest.mark.horovodrun
def test_on_two_healthy_hosts_verify_passes(two_hosts, bed_dirs):
    data_dir, model_dir = bed_dirs
    result = verify_from_host_a(data_dir, model_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines() == [result.stdout.strip().splitlines()[-1]]
    assert re.fullmatch(r"verify: largest weight difference \S+ after 3 float64 steps at -np 2 "
                        r"against -np 1 \(at most 1e-09\): PASS", result.stdout.strip())


OTHER_VENV = os.path.join(os.path.dirname(sys.prefix), ".venv-tf2.15")


@pytest.mark.hosts
@pytest.mark.skipif(not os.path.exists(os.path.join(OTHER_VENV, "bin", "python")),
                    reason=f"no second stack to put on hostB ({OTHER_VENV}: make setup TF=2.15)")
def test_a_host_with_another_tensorflow_is_named(two_hosts, bed_dirs):
    data_dir, model_dir = bed_dirs
    # hostB gets TensorFlow 2.15's venv at this venv's path, as a host set up apart would.
    on_host_only("hostB", "mount", "--bind", OTHER_VENV, sys.prefix)
    try:
        result = verify_from_host_a(data_dir, model_dir)
    finally:
        on_host_only("hostB", "umount", sys.prefix)
    assert_named(result, [r"verify: hostB: TensorFlow 2\.15\.\d+, hostA has 2\.(?!15\.)\S+",
                          r"verify: hostB: Python 3\.11\.\d+, hostA has 3\.\S+"])


@pytest.mark.hosts
def test_a_host_with_a_damaged_copy_of_the_data_is_named(two_hosts, bed_dirs, tmp_path):
    data_dir, model_dir = bed_dirs
    host_b_copy = tmp_path / "hostB-data"
    shutil.copytree(data_dir, host_b_copy)
    flip_middle_4k(next(host_b_copy.rglob("train-images.tensor")))
    on_host_only("hostB", "mount", "--bind", str(host_b_copy), str(data_dir))
    try:
        result = verify_from_host_a(data_dir, model_dir)
    finally:
        on_host_only("hostB", "umount", str(data_dir))
    damaged = f"{data_dir}/hvd_mnist_decoded/mnist-3.0.1/train-images.tensor"
    assert_named(result, [re.escape(
        f"verify: hostB: {damaged} is damaged (its sha256 is not the one recorded when it was "
        "written); prepare it again there with: make data")])
    assert not any(line.startswith("verify: hostA") for line in result.stdout.splitlines())


@pytest.mark.hosts
def test_a_host_that_cannot_reach_the_other_is_named(two_hosts, bed_dirs):
    data_dir, model_dir = bed_dirs
    # hostB has no route to hostA but for its sshd's replies, so hostA still reaches hostB
    # over ssh: a one-way firewall, made of hostB's routing rules (the bed has no iptables).
    rules = [["priority", "100", "to", "10.77.0.11", "ipproto", "tcp", "sport", SSH_PORT,
              "lookup", "main"],
             ["priority", "101", "to", "10.77.0.11", "unreachable"]]
    ip_rule = ["ip", "-n", host_namespace("hostB"), "rule"]
    for rule in rules:
        subprocess.run([*ip_rule, "add", *rule], check=True)
    try:
        result = verify_from_host_a(data_dir, model_dir)
    finally:
        for rule in rules:
            subprocess.run([*ip_rule, "del", *rule], check=True)
    assert_named(result, [re.escape(f"verify: hostB: cannot reach hostA (10.77.0.11) at port "
                                    f"{SSH_PORT} on eth0: Network is unreachable")])
    assert not any(line.startswith("verify: hostA") for line in result.stdout.splitlines())


@pytest.mark.hosts
def test_a_host_whose_link_is_down_is_named(two_hosts, bed_dirs):
    data_dir, model_dir = bed_dirs
    hosts_tool("link", "hostB", "down")
    try:
        result = verify_from_host_a(data_dir, model_dir)
    finally:
        hosts_tool("link", "hostB", "up")
    # ssh writes the name it was given in lower case
    assert_named(result, [r"verify: hostB: cannot run the check over ssh \(ssh: connect to host "
                          rf"hostb port {SSH_PORT}: .+\)"])
