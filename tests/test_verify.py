"""python -m hvd_mnist.verify: the host list, the comparison of what hosts report, the
whole command on this machine, and on the test bed of two hosts (marked `hosts`): a
healthy pair passes, and each planted fault is named in one line, with model_dir as it was.
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
from hvd_mnist.errors import UserFacingError
from hvd_mnist.verification import agreement, hosts, preflight, probe, remote
from hvd_mnist.verification.hosts import Host


# ---------------------------------------------------------------- host lists

@pytest.mark.parametrize("text,expected", [
    ("hostA:1,hostB:2", [Host("hostA", 1), Host("hostB", 2)]),
    ("localhost:4", [Host("localhost", 4)]),
    ("hostA, hostB:3", [Host("hostA", 1), Host("hostB", 3)]),  # no slots: one
])
def test_host_lists_read_as_horovodrun_reads_them(text, expected):
    assert hosts.parse_host_list(text) == expected
    assert hosts.horovodrun_hosts(expected) == ",".join(f"{h.name}:{h.slots}" for h in expected)


@pytest.mark.parametrize("text,message", [
    ("hostA:0", "'hostA:0' is not HOST:SLOTS"),
    ("hostA:x", "'hostA:x' is not HOST:SLOTS"),
    ("hostA:1,,hostB:1", "'' is not HOST:SLOTS"),
    ("hostA:1,hostA:2", "names hostA more than once"),
])
def test_a_bad_host_list_is_refused_naming_the_item(text, message):
    with pytest.raises(UserFacingError, match=message):
        hosts.parse_host_list(text)


@pytest.mark.parametrize("nodelist,expected", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("node[8-10]", ["node8", "node9", "node10"]),  # no padding: none added
    ("node[098-101]", ["node098", "node099", "node100", "node101"]),  # padding from the start
    ("a[1-2],login,b[3]", ["a1", "a2", "login", "b3"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu-a[1-2]-x", ["gpu-a1-x", "gpu-a2-x"]),
])
def test_slurm_node_lists_expand_as_scontrol_show_hostnames_does(nodelist, expected):
    assert hosts.expand_nodelist(nodelist) == expected


@pytest.mark.parametrize("nodelist", ["node[01-03", "node01]", "node[3-1]", "node[a-b]",
                                      "node[1,,2]", "a,,b", "a[[1]]"])
def test_a_node_list_that_cannot_be_read_is_named(nodelist):
    with pytest.raises(UserFacingError, match="cannot read the Slurm node list"):
        hosts.expand_nodelist(nodelist)


def test_tasks_per_node_expand():
    assert hosts.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert hosts.expand_tasks_per_node("4") == [4]
    with pytest.raises(UserFacingError, match="SLURM_TASKS_PER_NODE"):
        hosts.expand_tasks_per_node("2(3)")


def test_a_slurm_allocation_is_the_host_list_without_hosts():
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    assert hosts.resolve("", env) == [Host("n1", 2), Host("n2", 2), Host("n3", 1)]
    env["SLURM_NTASKS_PER_NODE"] = "4"  # --ntasks-per-node given: every node has that many
    assert hosts.resolve("", env) == [Host("n1", 4), Host("n2", 4), Host("n3", 4)]
    assert hosts.resolve("", {"SLURM_NODELIST": "n[1-2]"}) == [Host("n1", 1), Host("n2", 1)]
    assert hosts.resolve("x:2", env) == [Host("x", 2)]  # --hosts wins
    with pytest.raises(UserFacingError, match="has 3 nodes .* but tasks for 2"):
        hosts.resolve("", {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "1(x2)"})
    with pytest.raises(UserFacingError, match="no hosts to verify"):
        hosts.resolve("", {})


# ---------------------------------------------------------------- comparing the reports

def facts(tensorflow="2.21.0", build="TensorFlow with gloo", data=None, problems=()):
    return {"versions": {"python": "3.12.1", "tensorflow": tensorflow, "keras": "3.13.0",
                         "horovod": "0.28.1", "hvd_mnist": "0.1.0, code abc"},
            "horovod_build": build, "data": data or {"train-images.tensor": "aa"},
            "problems": list(problems)}


def test_hosts_that_agree_have_no_problems():
    assert preflight.compare({"hostA": facts(), "hostB": facts(), "hostC": facts()},
                             "data/tfds") == []


def test_each_difference_is_one_line_naming_the_host_and_the_first_hosts_value():
    answers = {
        "hostA": facts(),
        "hostB": facts(tensorflow="2.15.1"),
        "hostC": facts(build="TensorFlow with gloo, mpi"),
        "hostD": facts(data={"train-images.tensor": "bb"}),
        "hostE": facts(problems=["--model_dir=runs/x is not writable (Read-only file system "
                                 "in /)"]),
    }
    assert preflight.compare(answers, "data/tfds") == [
        "hostB: TensorFlow 2.15.1, hostA has 2.21.0",
        "hostC: Horovod built for TensorFlow with gloo, mpi, hostA's for TensorFlow with gloo",
        "hostD: the prepared data in data/tfds is not hostA's (make data recorded other files "
        "or sha256s: train-images.tensor)",
        "hostE: --model_dir=runs/x is not writable (Read-only file system in /)",
    ]


def test_a_host_that_did_not_answer_is_named_and_the_next_one_is_the_reference():
    answers = {"hostA": {"problems": ["cannot run the check over ssh (Connection refused)"]},
               "hostB": facts(), "hostC": facts(tensorflow="2.15.1")}
    assert preflight.compare(answers, "d") == [
        "hostA: cannot run the check over ssh (Connection refused)",
        "hostC: TensorFlow 2.15.1, hostB has 2.21.0"]


def test_what_a_host_could_not_report_is_not_compared():
    broken = facts(tensorflow=None, build="", data={},
                   problems=["cannot import TensorFlow (No module named 'tensorflow')"])
    assert preflight.compare({"hostA": facts(), "hostB": broken}, "d") == [
        "hostB: cannot import TensorFlow (No module named 'tensorflow')"]


def test_hosts_reach_each_other_by_interface_address_or_by_name():
    answers = {"hostA": {**facts(), "address": "10.0.0.1"},
               "hostB": {**facts(), "address": "10.0.0.2"},
               "hostC": {"problems": ["cannot run the check over ssh (timeout)"]}}
    by_address = preflight.reach_requests(answers, 2222, "eth0")
    assert by_address["hostA"]["peers"] == [["hostB", "10.0.0.2"]]
    assert by_address["hostB"] == {"question": "reach", "port": 2222, "interface": "eth0",
                                   "source": "10.0.0.2", "peers": [["hostA", "10.0.0.1"]]}
    by_name = preflight.reach_requests(answers, 0, "")
    assert by_name["hostA"]["peers"] == [["hostB", "hostB"]] and set(by_name) == {"hostA",
                                                                                   "hostB"}
    assert by_name["hostA"]["port"] == 22 and by_name["hostA"]["source"] == ""


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
                          env={**os.environ, **HOROVOD_TEST_ENV})


@pytest.mark.horovodrun
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
                            env={**os.environ, **HOROVOD_TEST_ENV, **BED_ENV})
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
