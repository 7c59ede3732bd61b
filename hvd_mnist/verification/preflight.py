"""Before any step: is every host the same as the first one, and can each reach the others?

Each host answers probe.py's two questions; the first host that answered is the
reference the others are compared with (the launching host, normally). Every problem
is one line naming its host: `hostB: TensorFlow 2.15.1, hostA has 2.21.0`.
"""

from hvd_mnist.verification import remote

VERSIONS = (("python", "Python"), ("tensorflow", "TensorFlow"), ("keras", "Keras"),
            ("horovod", "Horovod"), ("hvd_mnist", "hvd_mnist"))
FACTS_TIMEOUT_SECONDS = 300  # TensorFlow's import on a loaded host can take a minute
REACH_TIMEOUT_SECONDS = 120
SSH_DEFAULT_PORT = 22
MAX_FILES_NAMED = 3


def differences(host: str, answer: dict, reference: str, expected: dict,
                data_dir: str) -> list:
    """How `answer` (host's facts) differs from `expected` (the reference host's)."""
    lines = []
    for key, name in VERSIONS:
        theirs, ours = answer["versions"].get(key), expected["versions"].get(key)
        if theirs and ours and theirs != ours:
            lines.append(f"{host}: {name} {theirs}, {reference} has {ours}")
    theirs, ours = answer.get("horovod_build"), expected.get("horovod_build")
    if theirs and ours and theirs != ours:
        lines.append(f"{host}: Horovod built for {theirs}, {reference}'s for {ours}")
    theirs, ours = answer.get("data") or {}, expected.get("data") or {}
    if theirs and ours and theirs != ours:
        files = sorted(name for name in set(theirs) | set(ours)
                       if theirs.get(name) != ours.get(name))
        named = ", ".join(files[:MAX_FILES_NAMED]) + (" ..." if len(files) > MAX_FILES_NAMED
                                                       else "")
        lines.append(f"{host}: the prepared data in {data_dir} is not {reference}'s (make "
                     f"data recorded other files or sha256s: {named})")
    return lines


def compare(answers: dict, data_dir: str) -> list:
    """Problem lines of the facts answers ({host: answer}, in host order): each host's
    own problems, then how it differs from the first host that answered."""
    answered = [host for host, answer in answers.items() if "versions" in answer]
    lines = []
    for host, answer in answers.items():
        lines += [f"{host}: {problem}" for problem in answer.get("problems", [])]
        if answered and host != answered[0] and host in answered:
            lines += differences(host, answer, answered[0], answers[answered[0]], data_dir)
    return lines


def reach_requests(answers: dict, ssh_port: int, interface: str) -> dict:
    """For each host that answered, the others to connect to: at their address on the
    interface when one is named (where Horovod's workers will talk), else by name."""
    targets = {host: (answer.get("address") if interface else host)
               for host, answer in answers.items() if "versions" in answer}
    targets = {host: address for host, address in targets.items() if address}
    return {host: {"question": "reach", "port": ssh_port or SSH_DEFAULT_PORT,
                   "interface": interface, "source": address if interface else "",
                   "peers": [[peer, address] for peer, address in targets.items()
                             if peer != host]}
            for host, address in targets.items()}


def check(host_names: list, data_dir: str, model_dir: str, interface: str,
          ssh: remote.Ssh) -> list:
    """Every problem line of every host: what it has, then what it can reach."""
    request = {"question": "facts", "data_dir": data_dir, "model_dir": model_dir,
               "interface": interface}
    answers = remote.ask_all(host_names, {host: request for host in host_names}, ssh,
                             FACTS_TIMEOUT_SECONDS)
    lines = compare(answers, data_dir)
    requests = reach_requests(answers, ssh.port, interface)
    if len(host_names) > 1 and requests:
        reached = remote.ask_all(list(requests), requests, ssh, REACH_TIMEOUT_SECONDS)
        lines += [f"{host}: {problem}" for host, answer in reached.items()
                  for problem in answer["problems"]]
    return lines
