"""hvd_mnist.verification's parts that need no host: reading host lists (horovodrun's and
Slurm's) and comparing what the hosts report, one line per difference."""

import pytest

from hvd_mnist.errors import UserFacingError
from hvd_mnist.verification import hosts, preflight
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
