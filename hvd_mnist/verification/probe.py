"""What verify asks each host, run on that host: `python -m hvd_mnist.verification.probe REQUEST`.

REQUEST and the answer are one JSON object each (the answer is stdout's last line), so the
same code answers on the launching host and, over ssh, on every other one. Two questions:
`facts` (versions, Horovod's build, the prepared data, model_dir, the interface's address)
and `reach` (a TCP connection to each other host). A check that fails becomes a line in
the answer's `problems`; the probe itself never fails on what it finds.
"""

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import sys
import tempfile

from hvd_mnist.worker import quiet

quiet.before_tensorflow()

from hvd_mnist.errors import short_reason  # noqa: E402

# A run writes checkpoints of ~15 MB (weights and Adadelta's two slots), keeps 3, plus an
# export and TensorBoard's events: 100 MiB leaves room for that and for the checks.
MIN_FREE_BYTES = 100 << 20
CONNECT_TIMEOUT_SECONDS = 5
# The build features horovodrun --check-build lists for a framework.
HOROVOD_BUILD = ("mpi", "gloo", "nccl", "ddl", "ccl", "cuda", "rocm")


def code_digest(package_dir: str) -> str:
    """sha256 over the package's .py files (relative names and contents): the same code
    gives the same digest wherever it is checked out."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, package_dir).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read() + b"\0")
    return digest.hexdigest()[:12]


def versions(problems: list) -> dict:
    import hvd_mnist
    try:
        release = importlib.metadata.version("hvd_mnist")
    except importlib.metadata.PackageNotFoundError:
        release = "(not installed)"
    found = {"python": platform.python_version(),
             "hvd_mnist": f"{release}, code {code_digest(os.path.dirname(hvd_mnist.__file__))}"}
    try:
        with quiet.native_info_lines_dropped():
            import tensorflow as tf
        from hvd_mnist.worker import keras_compat
        found.update(tensorflow=tf.__version__, keras=keras_compat.keras_version())
    except Exception as e:  # a broken install is what this looks for
        problems.append(f"cannot import TensorFlow ({short_reason(e)})")
    try:
        import horovod
        found["horovod"] = horovod.__version__
    except Exception as e:
        problems.append(f"cannot import Horovod ({short_reason(e)})")
    return found


def horovod_build(problems: list) -> str:
    """Horovod's TensorFlow extension as --check-build describes it: what it was built with."""
    try:
        import horovod.tensorflow as hvd
        built = [name for name in HOROVOD_BUILD if getattr(hvd, f"{name}_built")()]
    except Exception as e:
        problems.append(f"Horovod cannot load its TensorFlow extension ({short_reason(e)}); "
                        "build it again against this TensorFlow (make setup)")
        return ""
    return "TensorFlow with " + (", ".join(built) or "nothing")


def data(data_dir: str, problems: list) -> dict:
    """What make data recorded of data_dir (file -> sha256), and whether the files on this
    host are still what it recorded."""
    from hvd_mnist.data import decoded, splits
    from hvd_mnist.errors import DataError
    try:
        splits.check_prepared(data_dir)
        recorded = {}
        for split in splits.SPLITS:
            entry = decoded.recorded_split(splits.decoded_dir(data_dir), split, "{}")
            if entry is None:
                raise DataError(f"{data_dir} has no record of its files (no "
                                f"{decoded.SOURCE_FILE}); prepare it again with: make data")
            recorded.update({f["name"]: f["sha256"]
                             for f in entry["tfds_files"] + entry["files"]})
        part, reason = splits.damaged_part(data_dir)
        if part:
            problems.append(f"{reason}; prepare it again there with: make data")
        return recorded
    except DataError as e:
        problems.append(str(e))
    except Exception as e:
        problems.append(f"cannot check the prepared data in {data_dir} ({short_reason(e)})")
    return {}


def model_dir_problem(model_dir: str) -> str:
    """"" when a file can be written (and is removed again) in model_dir, or where it would
    be created, with MIN_FREE_BYTES free; else what is wrong."""
    existing = os.path.abspath(model_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"--model_dir={model_dir} is not writable ({existing} is not a directory)"
    try:
        descriptor, path = tempfile.mkstemp(prefix=".hvd_mnist_verify-", dir=existing)
        try:
            os.write(descriptor, b"hvd_mnist verify\n")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
            os.remove(path)
    except OSError as e:
        return f"--model_dir={model_dir} is not writable ({e.strerror or e} in {existing})"
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        return (f"--model_dir={model_dir} has {free >> 20} MiB free, less than the "
                f"{MIN_FREE_BYTES >> 20} MiB a run needs")
    return ""


def interface_address(interface: str, problems: list) -> str:
    import psutil  # Horovod's dependency; its launcher finds interfaces the same way
    addresses = psutil.net_if_addrs()
    ipv4 = [a.address for a in addresses.get(interface, []) if a.family == socket.AF_INET]
    if not ipv4:
        problems.append(f"has no IPv4 address on --network_interface={interface} (its "
                        f"interfaces: {', '.join(sorted(addresses))})")
        return ""
    return ipv4[0]


def facts(request: dict) -> dict:
    problems = []
    answer = {"versions": versions(problems), "horovod_build": horovod_build(problems),
              "data": data(request["data_dir"], problems)}
    problem = model_dir_problem(request["model_dir"])
    if problem:
        problems.append(problem)
    if request.get("interface"):
        answer["address"] = interface_address(request["interface"], problems)
    return {**answer, "problems": problems}


def reach(request: dict) -> dict:
    """A TCP connection to each peer's (name, address) at the ssh port, from this host's
    address on the interface when one is named: what Horovod's workers will need of each
    other (Gloo binds its sockets to that address, as here, and lets routing decide)."""
    problems = []
    for name, address in request["peers"]:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if request.get("source"):
                    s.bind((request["source"], 0))
                s.settimeout(CONNECT_TIMEOUT_SECONDS)
                s.connect((address, request["port"]))
        except OSError as e:
            via = f" on {request['interface']}" if request.get("interface") else ""
            where = name if address == name else f"{name} ({address})"
            problems.append(f"cannot reach {where} at port {request['port']}{via}: "
                            f"{e.strerror or short_reason(e)}")
    return {"problems": problems}


def main(argv) -> int:
    request = json.loads(argv[1])
    answer = {"facts": facts, "reach": reach}[request["question"]](request)
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
