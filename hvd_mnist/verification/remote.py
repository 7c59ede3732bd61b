"""Running the probe on every host at once, the way horovodrun runs its workers there.

A host whose name resolves to an address of this machine runs it here; any other over
`ssh host 'cd <this directory> ; <this python> -m ...'`, with horovodrun's ssh options,
so a host that verify reaches is one horovodrun reaches too.
"""

import concurrent.futures
import dataclasses
import json
import os
import shlex
import subprocess
import sys

SSH_CONNECT_TIMEOUT_SECONDS = 10
# Variables the probe must see as the workers will (horovodrun passes its whole
# environment; these are the ones that change what Python imports).
FORWARDED = ("PYTHONPATH", "TF_USE_LEGACY_KERAS")


@dataclasses.dataclass(frozen=True)
class Ssh:
    port: int = 0  # 0: ssh's default
    identity_file: str = ""


def is_local(host: str) -> bool:
    """horovodrun's own test: does the name resolve to one of this machine's addresses?"""
    from horovod.runner.util import network
    try:
        return network.resolve_host_address(host) in network.get_local_host_addresses()
    except OSError:  # a name that does not resolve is not this machine
        return False


def ssh_command(host: str, command: list, ssh: Ssh) -> list:
    # horovodrun's options (horovod.runner.util.remote), plus a bound on a dead host.
    options = ["-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no",
               "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_SECONDS}"]
    if ssh.port:
        options += ["-p", str(ssh.port)]
    if ssh.identity_file:
        options += ["-i", ssh.identity_file]
    env = [f"{name}={os.environ[name]}" for name in FORWARDED if name in os.environ]
    remote = (f"cd {shlex.quote(os.getcwd())} > /dev/null 2>&1 ; "
              + shlex.join((["env", *env] if env else []) + command))
    return ["ssh", *options, host, remote]


def probe_command(request: dict) -> list:
    return [sys.executable, "-m", "hvd_mnist.verification.probe", json.dumps(request)]


def ask(host: str, request: dict, ssh: Ssh, timeout_seconds: float) -> dict:
    """The probe's answer on `host`; {"problems": [why it could not be asked]} when the
    host cannot be reached or the probe did not answer."""
    command = probe_command(request)
    local = is_local(host)
    if not local:
        command = ssh_command(host, command, ssh)
    try:
        result = subprocess.run(command, capture_output=True, text=True,
                                timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        return {"problems": [f"the check did not answer within {timeout_seconds:.0f} s"]}
    lines = result.stdout.strip().splitlines()
    if result.returncode == 0 and lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    last = (result.stderr.strip().splitlines() or ["no output"])[-1].strip()
    if not local and result.returncode == 255:  # ssh's own failure
        return {"problems": [f"cannot run the check over ssh ({last})"]}
    return {"problems": [f"the check failed (exit {result.returncode}: {last})"]}


def ask_all(hosts: list, requests: dict, ssh: Ssh, timeout_seconds: float) -> dict:
    """{host: answer} for each host's own request, asked in parallel."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        futures = {host: pool.submit(ask, host, requests[host], ssh, timeout_seconds)
                   for host in hosts}
        return {host: future.result() for host, future in futures.items()}
