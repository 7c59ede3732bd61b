"""Host discovery as horovodrun's elastic driver runs it, about once a second for a whole
job: with tools/horovod-patches/elastic-discovery-subprocess.patch it is one short child
process. Unpatched, every call started a middleman Python interpreter: 0.33 s of CPU a
call, a quarter of a core taken from the workers (BUILD_NOTES.md)."""

import pytest
from horovod.runner.elastic.discovery import HostDiscoveryScript

from tools.bench import elastic as elastic_bench

# Far above a shell and grep (about 0.004 s here), far below an interpreter's start.
MOST_CPU_SECONDS_PER_CALL = 0.05


def test_discovery_reads_the_hosts_file_for_little_cpu(tmp_path):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text("# the test's two one-slot hosts\nlocalhost:1\n\n127.0.0.1:1\n")
    command = elastic_bench.discovery_command(str(hosts_file))

    assert HostDiscoveryScript(command, slots=1).find_available_hosts_and_slots() == {
        "localhost": 1, "127.0.0.1": 1}
    assert elastic_bench.discovery_cpu_seconds(str(hosts_file)) < MOST_CPU_SECONDS_PER_CALL


def test_a_failing_discovery_script_is_an_error_naming_its_exit_code():
    with pytest.raises(RuntimeError, match="Exit code: 3"):
        HostDiscoveryScript("exit 3", slots=1).find_available_hosts_and_slots()
