"""A Slurm cluster on the test bed (tools/slurm/bed.sh) for the tests: bring it up and
down, submit deploy/slurm/train.sbatch from hostA, and read a job's state.

Each bed has its own namespaces, named after this process, and its own files under
/run; the daemons all live in the bed's namespaces, so `down` ends every one of them.
"""

import os
import re
import subprocess
import time

from hvd_mnist.verification import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BED_TOOL = os.path.join(ROOT, "tools", "slurm", "bed.sh")
BATCH_SCRIPT = os.path.join(ROOT, "deploy", "slurm", "train.sbatch")
# A job state Slurm will not change by itself (a requeued job goes back to PENDING).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}


class SlurmBed:
    ENDED = ENDED

    def __init__(self, prefix: str, subnet: str, ssh_port: int):
        self.dir = f"/run/{prefix}-hosts"
        self.ssh_port = ssh_port
        self.env = {**os.environ, "HOSTS_PREFIX": prefix, "HOSTS_DIR": self.dir,
                    "HOSTS_SUBNET": subnet, "HOSTS_SSH_PORT": str(ssh_port)}

    def tool(self, *args, timeout=180, check=True, env=None):
        return subprocess.run([BED_TOOL, *args], capture_output=True, text=True,
                              timeout=timeout, env={**self.env, **(env or {})}, check=check)

    def cannot_run_here(self) -> str:
        """Why no Slurm test bed can be made here, or ""."""
        check = self.tool("check", check=False)
        return "" if check.returncode == 0 else (check.stdout.strip() or check.stderr.strip())

    def up(self, num_hosts: int) -> None:
        up = self.tool("up", str(num_hosts), check=False)
        assert up.returncode == 0, up.stdout + up.stderr + self.logs()

    def down(self) -> None:
        self.tool("down")

    def hosts(self, *args, timeout=60):
        """tools/hosts.sh on this bed (link, sshd, ...)."""
        return subprocess.run([os.path.join(ROOT, "tools", "hosts.sh"), *args],
                              capture_output=True, text=True, timeout=timeout, env=self.env,
                              check=True)

    def on_controller(self, *command, timeout=60, env=None) -> str:
        """A Slurm command run on hostA; its output."""
        run = self.tool("exec", "hostA", *command, timeout=timeout, check=False, env=env)
        assert run.returncode == 0, f"{command}: {run.stdout}{run.stderr}"
        return run.stdout

    def sbatch(self, workdir, settings: dict, *options) -> str:
        """deploy/slurm/train.sbatch submitted from hostA in workdir, with the
        HVD_MNIST_* settings (and any other environment) in `settings`; its job id."""
        horovodrun_flags = (f"--ssh-port {self.ssh_port} --ssh-identity-file {self.dir}/id_ed25519 "
                            "--network-interface eth0 --disable-cache")
        env = {"HVD_MNIST_VENV": os.path.dirname(launch.BIN_DIR),  # the tests' own venv
               "HVD_MNIST_HOROVODRUN_FLAGS": horovodrun_flags,
               "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               "PYTHONUNBUFFERED": "1",  # the job's output file shows each line as it comes
               **settings}
        return self.on_controller(
            "sbatch", "--parsable", f"--chdir={workdir}", f"--output={workdir}/slurm-%j.out",
            "--time=5", *options, BATCH_SCRIPT, env=env).strip()

    def job(self, job_id: str) -> dict:
        """`scontrol show job` as a dict: JobState, ExitCode, Restarts, ..."""
        line = self.on_controller("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def wait_for_job(self, job_id: str, states=ENDED, timeout=300) -> dict:
        deadline = time.monotonic() + timeout
        while (job := self.job(job_id))["JobState"] not in states:
            assert time.monotonic() < deadline, f"job {job_id} still {job['JobState']}"
            time.sleep(0.5)
        return job

    def wait_until_idle(self, timeout=120) -> None:
        """Every node idle again (a cut link restored, the last job's processes gone)."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.on_controller("sinfo", "-h", "-N", "-o", "%N %t").split("\n")
            if all(line.endswith(" idle") for line in filter(None, states)):
                return
            assert time.monotonic() < deadline, f"nodes not idle: {states}\n{self.logs()}"
            time.sleep(0.5)

    def logs(self) -> str:
        """The end of every daemon's log, for a failure's message."""
        text = []
        for directory, _, files in os.walk(f"{self.dir}/slurm"):
            for name in files:
                if name.endswith(".log"):
                    with open(os.path.join(directory, name), errors="replace") as f:
                        text.append(f"--- {directory}/{name}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(text)

