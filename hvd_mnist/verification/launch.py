"""The one way hvd_mnist's tools start a Horovod job: the `horovodrun` command line (static
or elastic) and its environment, for verify (agreement.py), the tests (tests/conftest.py,
tests/elastic_jobs.py) and the bench.

The environment has Horovod's stall check on, so a stalled rank ends the job within
minutes instead of hanging it. Precedence, lowest first: DEFAULT_ENV, then this process's
environment (what the caller exported, e.g. the Makefile's values), then the `env` a
caller passes explicitly. So an explicit choice always wins and a default never overrides
one.
"""

import os
import subprocess
import sys

# This interpreter's venv: its horovodrun, and the python its workers run.
BIN_DIR = os.path.dirname(sys.executable)
DEFAULT_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
               "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120",
               "TF_CPP_MIN_LOG_LEVEL": "1",
               "OMPI_MCA_mpi_yield_when_idle": "1"}  # MPI's waiting ranks would busy-poll


def options(controller: str = "gloo", ssh_port: int = 0, ssh_identity_file: str = "",
            network_interface: str = "", disable_cache: bool = False) -> list:
    """horovodrun's options before the program. The controller explicitly: where Horovod is
    also built with MPI, horovodrun would pick MPI."""
    out = [f"--{controller}"]
    if disable_cache:  # ask every host now, not what answered an hour ago
        out.append("--disable-cache")
    if ssh_port:
        out += ["--ssh-port", str(ssh_port)]
    if ssh_identity_file:
        out += ["--ssh-identity-file", ssh_identity_file]
    if network_interface:
        out += ["--network-interface", network_interface]
    return out


def horovodrun_command(np_: int, program: list, hosts: str = "", flags=None,
                       bin_dir: str = BIN_DIR) -> list:
    """`horovodrun -np N -H hosts flags... program...` with bin_dir's horovodrun; hosts
    defaults to localhost:N, flags to options()."""
    return [os.path.join(bin_dir, "horovodrun"), "-np", str(np_), "-H",
            hosts or f"localhost:{np_}", *(options() if flags is None else flags), *program]


def elastic_command(np_: int, max_np: int, discovery_script: str, program: list,
                    flags=None, bin_dir: str = BIN_DIR) -> list:
    """`horovodrun` elastic: np_ workers to start, then 1 to max_np as the hosts that
    discovery_script prints come and go. flags default to options() on the loopback
    interface, for hosts that are this machine's names for itself (localhost, 127.0.0.1).
    Elastic horovodrun runs Gloo whatever the controller flag; --gloo only says so."""
    return [os.path.join(bin_dir, "horovodrun"), "-np", str(np_), "--min-np", "1",
            "--max-np", str(max_np), "--host-discovery-script", discovery_script,
            # After a reset the workers have a minute to meet again, not horovodrun's ten.
            "--elastic-timeout", "60",
            *(options(network_interface="lo") if flags is None else flags), *program]


def environment(env=None) -> dict:
    """DEFAULT_ENV under this process's environment under `env` (see the docstring)."""
    return {**DEFAULT_ENV, **os.environ, **(env or {})}


def run(command: list, timeout_seconds: float, env=None, cwd=None) -> subprocess.CompletedProcess:
    """Runs a job to its end, its output as text; past the timeout, subprocess.TimeoutExpired."""
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_seconds,
                          cwd=cwd, env=environment(env))
