"""The venv the PyTorch side of make bench runs in (.venv-torch), made when missing.

The pins of tools/pins/torch.txt (PyTorch's CPU build) with a Python its "# pythons:" line
allows, found as tools/setup_python.sh finds one (python3.X on PATH, then pyenv's versions).
A stamp beside the venv records the pins it was made from, so a changed pin makes it again
and a venv cut short by a failed install is never taken as whole.

    python -m tools.bench.torch_venv [--venv=.venv-torch]      (make torch-venv)
"""

import argparse
import glob
import os
import shutil
import subprocess

from tools.bench import launch

PINS = os.path.join(launch.REPO_ROOT, "tools", "pins", "torch.txt")
DEFAULT_VENV = os.path.join(launch.REPO_ROOT, ".venv-torch")
STAMP = ".setup-done"


def pythons_allowed(pins: str = PINS) -> list:
    """The pins file's "# pythons:" line, e.g. ["3.11"]."""
    with open(pins) as f:
        for line in f:
            if line.startswith("# pythons:"):
                return line.split(":", 1)[1].split()
    raise SystemExit(f"torch_venv: {pins} has no '# pythons:' line")


def find_python(versions: list) -> str:
    """python3.X on PATH, else pyenv's newest 3.X.*, for the first X found."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for version in versions:
        on_path = shutil.which(f"python{version}")
        # pyenv's shim may name a version that is not installed: run it to be sure.
        candidates = ([on_path] if on_path else []) + sorted(
            glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")),
            reverse=True)
        for candidate in candidates:
            if subprocess.run([candidate, "-c", "import venv, ensurepip"],
                              capture_output=True).returncode == 0:
                return candidate
    raise SystemExit(f"torch_venv: no Python {' or '.join(versions)} (with venv) on PATH or "
                     "in pyenv; install one, e.g. apt-get install python3.11 python3.11-venv")


def python_of(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def is_ready(venv: str, pins: str = PINS) -> bool:
    """The venv was made whole from these pins."""
    stamp = os.path.join(venv, STAMP)
    if not os.path.exists(stamp) or not os.path.exists(python_of(venv)):
        return False
    with open(stamp) as f, open(pins) as p:
        return f.read() == p.read()


def ensure(venv: str = DEFAULT_VENV, pins: str = PINS) -> str:
    """The venv's python, after making the venv when it is missing or stale."""
    if is_ready(venv, pins):
        return python_of(venv)
    python = find_python(pythons_allowed(pins))
    print(f"torch_venv: making {venv} with {python} and {os.path.relpath(pins)}", flush=True)
    if os.path.exists(venv):
        shutil.rmtree(venv)
    steps = [[python, "-m", "venv", venv],
             [python_of(venv), "-m", "pip", "install", "--quiet", "-r", pins]]
    for step in steps:
        if subprocess.run(step).returncode != 0:
            raise SystemExit(f"torch_venv: failed: {' '.join(step)}")
    with open(pins) as p, open(os.path.join(venv, STAMP), "w") as f:
        f.write(p.read())
    return python_of(venv)


def versions(python: str) -> dict:
    """Python's, PyTorch's and numpy's versions in the venv of `python`."""
    out = subprocess.run([python, "-c", "import sys, numpy, torch; print(sys.version.split()[0],"
                          " torch.__version__, numpy.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(("python", "torch", "numpy"), out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=DEFAULT_VENV)
    venv_python = ensure(os.path.abspath(parser.parse_args().venv))
    print(f"torch_venv: {venv_python}: {versions(venv_python)}")
