"""The test bed of hosts (tools/hosts.sh) for the tests that run on several hosts.

One bed per test module that asks for it, in namespaces named after this test session's
pid, so a stray or concurrent bed (another session's) is never touched. Without root (or
iproute2, openssh-server) the tests that ask for it skip and say why.
"""

import os
import subprocess

import pytest

HOSTS_TOOL = os.path.join(os.path.dirname(__file__), "..", "tools", "hosts.sh")
PREFIX = f"hvt{os.getpid()}"
BED_DIR = f"/run/{PREFIX}-hosts"
SSH_PORT = "2222"
BED_ENV = {"HOSTS_PREFIX": PREFIX, "HOSTS_DIR": BED_DIR, "HOSTS_SSH_PORT": SSH_PORT}
SSH_KEY = f"{BED_DIR}/id_ed25519"


def hosts_tool(*args, timeout=90, check=True):
    return subprocess.run([HOSTS_TOOL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **BED_ENV}, check=check)


@pytest.fixture(scope="module")
def two_hosts():
    """hostA and hostB, removed again however the tests end."""
    reason = hosts_tool("check", check=False)
    if reason.returncode != 0:
        pytest.skip(f"no test bed of hosts: {reason.stdout.strip() or reason.stderr.strip()}")
    try:
        hosts_tool("up", "2")
        yield
    finally:
        hosts_tool("down")


def host_namespace(host):
    return f"{PREFIX}-{host}"


def on_host_only(host, *command):
    """Runs command (e.g. mount) in the mount namespace of host's sshd, which everything
    ssh starts there inherits: a mount made so is that host's alone, and is gone with the
    bed (tools/hosts.sh starts each sshd in a namespace of its own, unpropagated)."""
    with open(f"{BED_DIR}/{host}/sshd.pid") as f:
        pid = f.read().strip()
    subprocess.run(["nsenter", "-t", pid, "-m", *command], check=True, capture_output=True,
                   timeout=30)
