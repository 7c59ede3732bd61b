"""Host discovery as horovodrun's elastic driver runs it, about once a second for a whole
job: with tools/horovod-patches/elastic-discovery-subprocess.patch it is one short child
process. Unpatched, every call started a middleman Python interpreter: 0.33 s of CPU a
call, a quarter of a core taken from the workers (BUILD_NOTES.md)."""

import pathlib
import resource
import shlex

import pytest
from horovod.runner.elastic.discovery import HostDiscoveryScript

DISCOVER = pathlib.Path(__file__).resolve().parents[1] / "tools" / "discover_hosts.sh"
# Far above a shell and grep (about 0.004 s here), far below an interpreter's start.
MOST_CPU_SECONDS_PER_CALL = 0.05


def cpu_seconds() -> float:
    """This process's CPU seconds and its reaped children's, user and system."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def test_discovery_reads_the_hosts_file_for_little_cpu(tmp_path):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text("# the test's two one-slot hosts\nlocalhost:1\n\n127.0.0.1:1\n")
    # As the driver is given it: a shell command line (HostDiscoveryScript runs it so).
    discovery = HostDiscoveryScript(
        f"HVD_MNIST_HOSTS_FILE={shlex.quote(str(hosts_file))} {shlex.quote(str(DISCOVER))}",
        slots=1)

    assert discovery.find_available_hosts_and_slots() == {"localhost": 1, "127.0.0.1": 1}
    start, calls = cpu_seconds(), 5
    for _ in range(calls):
        discovery.find_available_hosts_and_slots()
    assert (cpu_seconds() - start) / calls < MOST_CPU_SECONDS_PER_CALL


def test_a_failing_discovery_script_is_an_error_naming_its_exit_code():
    with pytest.raises(RuntimeError, match="Exit code: 3"):
        HostDiscoveryScript("exit 3", slots=1).find_available_hosts_and_slots()
