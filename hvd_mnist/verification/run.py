"""verify's order: the host list, the preflight on every host, then the agreement run."""

import dataclasses

from hvd_mnist.errors import UserFacingError
from hvd_mnist.verification import agreement, preflight, remote


@dataclasses.dataclass(frozen=True)
class VerifyConfig:
    hosts: tuple  # hosts.Host, the first one this machine (rank 0 runs there)
    data_dir: str
    model_dir: str
    network_interface: str = ""
    ssh_port: int = 0  # 0: ssh's default
    ssh_identity_file: str = ""
    controller: str = "gloo"
    steps: int = 5
    timeout_seconds: int = 600  # each of the two runs

    @property
    def ssh(self) -> remote.Ssh:
        return remote.Ssh(self.ssh_port, self.ssh_identity_file)


def verify(config: VerifyConfig, say=print) -> bool:
    """Says one line per problem and a last line with the verdict; True on PASS."""
    first = config.hosts[0].name
    if not remote.is_local(first):
        raise UserFacingError(f"run verify on {first}, the first host of the list: rank 0 "
                              "runs there, and verify reads the weights it writes")
    problems = preflight.check([host.name for host in config.hosts], config.data_dir,
                               config.model_dir, config.network_interface, config.ssh)
    for line in problems:
        say(f"verify: {line}")
    if problems:
        say(f"verify: FAIL: {len(problems)} problem{'s' * (len(problems) > 1)} found before "
            "any step; no steps run")
        return False
    outcome = agreement.run(config)
    for line in outcome.problems:
        say(f"verify: {line}")
    say(f"verify: {outcome.verdict_line()}")
    return outcome.passed
