"""Which Python `make setup` takes, what it installs for the build, and what it refuses
(tools/setup_python.sh), against stand-in Pythons: small shell scripts that answer the
version question and make a venv, on a PATH that holds nothing else of this machine.
A fake pyenv root, `id`, `dpkg-query` and `apt-get` play the rest of a machine.
"""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETUP_PYTHON = ROOT / "tools" / "setup_python.sh"
SETUP = ROOT / "tools" / "setup.sh"
BASH = shutil.which("bash")
# What setup_python.sh runs besides Python and bash builtins.
TOOLS = ["sed", "sort", "readlink", "mkdir", "rm", "dirname", "mktemp", "tail", "cp", "cat",
         "chmod"]
BUILD_TOOLS = ["gcc", "g++", "cmake", "make", "patch"]


def write_script(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


def fake_python(path: pathlib.Path, version: str) -> pathlib.Path:
    """A Python of this version as far as setup_python.sh can tell."""
    return write_script(path, f"""\
case "$1 $2" in
  "-c "*) echo {version} ;;
  "-m venv") mkdir -p "$3/bin" && echo "version = {version}" >"$3/pyvenv.cfg" \\
             && cp "$0" "$3/bin/python" ;;
  "-m pip") echo "pip 25.0" ;;
  *) exit 2 ;;
esac
""")


class Machine:
    """A PATH, a pyenv root and a venv path under tmp_path; run() runs setup_python.sh."""

    def __init__(self, tmp_path: pathlib.Path):
        self.tmp = tmp_path
        self.bin = tmp_path / "bin"
        self.tools = tmp_path / "tools"
        self.pyenv = tmp_path / "pyenv"
        self.venv = tmp_path / "venv"
        self.apt_calls = tmp_path / "apt-get.calls"
        self.policy_rc_d = tmp_path / "policy-rc.d"
        self.tools.mkdir()
        for tool in TOOLS:
            (self.tools / tool).symlink_to(shutil.which(tool))
        for tool in BUILD_TOOLS:
            write_script(self.bin / tool, "exit 0\n")
        self.user_id(0)

    def on_path(self, version: str) -> pathlib.Path:
        minor = ".".join(version.split(".")[:2])
        return fake_python(self.bin / f"python{minor}", version)

    def in_pyenv(self, version: str) -> pathlib.Path:
        minor = ".".join(version.split(".")[:2])
        return fake_python(self.pyenv / "versions" / version / "bin" / f"python{minor}", version)

    def user_id(self, uid: int):
        write_script(self.bin / "id", f"echo {uid}\n")

    def debian(self, python: pathlib.Path, installed=()):
        """Python is Debian's package; `installed` are the packages dpkg has."""
        cases = "".join(f'  "-W {name}") echo installed ;;\n' for name in installed)
        write_script(self.bin / "dpkg-query", f"""\
case "$1 $3" in
  "-S "*) [ "$2" = "{python}" ] && echo "python3-minimal: $2" ;;
{cases}  *) exit 1 ;;
esac
""")
        # Each call is recorded with whether the guard against starting services was there.
        write_script(self.bin / "apt-get", f"""\
guard=unguarded; [ -x "{self.policy_rc_d}" ] && guard=guarded
echo "$guard $*" >>"{self.apt_calls}"
""")

    def run(self, python: str = "", home: bool = True, script=SETUP_PYTHON, command=None,
            env=None):
        """setup_python.sh, or a bash command line run after sourcing it; `home`: PYENV_ROOT
        names the fake pyenv."""
        env = {"PATH": f"{self.bin}:{self.tools}", "VENV": str(self.venv), "TF": "2.21",
               "PYTHON": python, "POLICY_RC_D": str(self.policy_rc_d), **(env or {})}
        if home:
            env["PYENV_ROOT"] = str(self.pyenv)
        argv = [BASH, str(script)] if command is None else \
            [BASH, "-c", f'set -euo pipefail; source "{script}"; {command}']
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture
def machine(tmp_path):
    return Machine(tmp_path)


def first_line(result) -> str:
    return result.stdout.splitlines()[0]


def refusal(result) -> str:
    """The one line a refused run prints; nothing else is printed."""
    assert result.returncode == 1, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ------------------------------------------------------------ which Python

# (Pythons on PATH, Pythons in pyenv, the one taken: "path" or "pyenv" and its version)
CHOICES = {
    "3.12 first of 3.11, 3.12, 3.13": (["3.11.2", "3.12.4", "3.13.5"], [], ("path", "3.12.4")),
    "3.13 before 3.11": (["3.11.2", "3.13.5"], [], ("path", "3.13.5")),
    "Debian 12's own 3.11 alone": (["3.11.2"], [], ("path", "3.11.2")),
    "3.12 in pyenv before 3.11 on PATH": (["3.11.2"], ["3.12.1"], ("pyenv", "3.12.1")),
    "the same version: PATH before pyenv": (["3.12.4"], ["3.12.1"], ("path", "3.12.4")),
    "pyenv's newest patch release": ([], ["3.12.9", "3.12.10"], ("pyenv", "3.12.10")),
}


@pytest.mark.parametrize("on_path, in_pyenv, taken", CHOICES.values(), ids=CHOICES.keys())
def test_takes_the_first_python_of_the_preference_order(machine, on_path, in_pyenv, taken):
    made = {("path", v): machine.on_path(v) for v in on_path}
    made.update({("pyenv", v): machine.in_pyenv(v) for v in in_pyenv})
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert first_line(result) == f"setup: Python {taken[1]} ({made[taken]})"


@pytest.mark.parametrize("home", [None, "with ~/.pyenv"])
def test_without_pyenv_in_the_environment_only_path_is_searched(machine, home):
    # `env -i PATH=/usr/bin:... make train`: no PYENV_ROOT, no pyenv on PATH, and HOME unset
    # (under `set -u`) or one whose ~/.pyenv holds a preferred 3.12: the system's 3.11 is taken.
    python = machine.on_path("3.11.2")
    machine.in_pyenv("3.12.1")
    (machine.tmp / "home").mkdir()
    (machine.tmp / "home" / ".pyenv").symlink_to(machine.pyenv)
    result = machine.run(home=False, env={"HOME": str(machine.tmp / "home")} if home else {})
    assert result.returncode == 0, result.stderr
    assert first_line(result) == f"setup: Python 3.11.2 ({python})"


def test_an_existing_venv_keeps_its_python(machine):
    machine.on_path("3.12.4")
    fake_python(machine.tmp / "old" / "python3.13", "3.13.5")
    subprocess.run([str(machine.tmp / "old" / "python3.13"), "-m", "venv", str(machine.venv)],
                   check=True, env={"PATH": str(machine.tools)})
    result = machine.run()
    assert first_line(result) == \
        f"setup: Python 3.13.5 ({machine.venv}/bin/python, the existing venv's)"


# ------------------------------------------------------------ refusals

def test_no_python_at_all_names_what_to_install(machine):
    write_script(machine.bin / "apt-cache", '[ "$2" = python3.11 ]\n')
    assert refusal(machine.run()) == (
        "setup: no Python 3.12 3.13 3.11 on PATH or in pyenv for TF 2.21; install one "
        "(apt-get install python3.11 python3.11-venv python3.11-dev) or pass "
        "PYTHON=/path/to/python3.X")
    assert not machine.venv.exists()


@pytest.mark.parametrize("version", ["2.7.18", "3.9.18"])
def test_refuses_a_python_the_pins_do_not_list_and_writes_nothing(machine, version):
    python = machine.in_pyenv(version)
    assert refusal(machine.run(python=str(python))) == (
        f"setup: TF 2.21 has no wheels for Python {version} ({python}); pass "
        "PYTHON=/path/to/python3.X with X one of 3.12 3.13 3.11")
    assert not machine.venv.exists()


def test_the_pytorch_venv_takes_the_python_its_own_pins_allow(machine):
    # make torch-venv: tools/pins/torch.txt allows 3.11 alone, where TF's would take 3.12.
    torch_pins = {"PINS": str(ROOT / "tools" / "pins" / "torch.txt"), "FOR": "PyTorch's pins"}
    machine.on_path("3.12.4")
    python = machine.in_pyenv("3.11.7")
    result = machine.run(env=torch_pins)
    assert result.returncode == 0, result.stderr
    assert first_line(result) == f"setup: Python 3.11.7 ({python})"
    python.unlink()
    machine.venv.joinpath("bin", "python").unlink()  # no venv to keep its Python
    assert refusal(machine.run(env=torch_pins)).startswith(
        "setup: no Python 3.11 on PATH or in pyenv for PyTorch's pins; install one")


def test_refuses_a_missing_path_and_writes_nothing(machine):
    assert refusal(machine.run(python="/nonexistent")) == (
        "setup: PYTHON=/nonexistent: no such file; pass PYTHON=/path/to/python3.X with X "
        "one of 3.12 3.13 3.11")
    assert not machine.venv.exists()


def test_setup_sh_refuses_before_writing_anything(machine, tmp_path):
    result = subprocess.run([BASH, str(SETUP)], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "VENV": str(machine.venv),
                                 "PYTHON": "/nonexistent"})
    assert refusal(result).startswith("setup: PYTHON=/nonexistent: no such file")
    assert not machine.venv.exists()


# ------------------------------------------------------------ system packages

def test_root_installs_what_debians_python_and_the_build_lack(machine):
    python = machine.on_path("3.11.2")
    machine.debian(python, installed=["python3.11-venv"])
    (machine.bin / "cmake").unlink()
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split() == \
        ["setup:", "apt-get", "python3.11-dev", "cmake", "ok"]
    assert machine.apt_calls.read_text().splitlines() == [
        "guarded update", "guarded install -y --no-install-recommends python3.11-dev cmake"]
    assert not machine.policy_rc_d.exists()


def test_without_root_one_line_names_the_apt_get_install(machine):
    python = machine.on_path("3.11.2")
    machine.debian(python)
    (machine.bin / "g++").unlink()
    machine.user_id(1000)
    result = machine.run()
    assert first_line(result) == f"setup: Python 3.11.2 ({python})"
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "setup: the build needs python3.11-venv python3.11-dev g++; as root run: "
        "apt-get install python3.11-venv python3.11-dev g++"]
    assert not machine.apt_calls.exists()
    assert not machine.venv.exists()


def test_one_apt_get_update_for_the_build_and_the_test_beds_packages(machine):
    # What tools/setup.sh does: the build's packages (required), then the test bed's.
    machine.debian(machine.tmp / "python")
    result = machine.run(command="apt_install required cmake g++; apt_install optional iproute2")
    assert result.returncode == 0, result.stderr
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["setup:", "apt-get", "cmake", "g++", "ok"], ["setup:", "apt-get", "iproute2", "ok"]]
    assert machine.apt_calls.read_text().splitlines() == [
        "guarded update", "guarded install -y --no-install-recommends cmake g++",
        "guarded install -y --no-install-recommends iproute2"]
    assert not machine.policy_rc_d.exists()


def test_an_existing_policy_rc_d_is_left_in_place(machine):
    machine.debian(machine.tmp / "python")
    write_script(machine.policy_rc_d, "exit 101\n")
    assert machine.run(command="apt_install optional iproute2").returncode == 0
    assert machine.policy_rc_d.read_text() == "#!/bin/sh\nexit 101\n"


def test_without_root_optional_packages_are_skipped_in_one_line(machine):
    machine.debian(machine.tmp / "python")
    machine.user_id(1000)
    result = machine.run(command="apt_install optional iproute2 openssh-server; echo went on")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "setup: not installing iproute2 openssh-server (needs root and apt-get); the tests "
        "that need them will skip", "went on"]
    assert not machine.apt_calls.exists()


def test_a_failed_install_of_the_build_packages_stops_with_its_log(machine):
    machine.debian(machine.tmp / "python")
    write_script(machine.bin / "apt-get",
                 '[ "$1" = update ] || { echo "E: Unable to locate package cmake"; exit 100; }\n')
    result = machine.run(command="apt_install required cmake; echo went on")
    assert result.returncode == 1
    assert result.stdout.split() == ["setup:", "apt-get", "cmake", "FAILED"]
    lines = result.stderr.splitlines()
    assert lines[0].startswith("setup: apt-get install cmake failed; last lines of ")
    assert lines[1:] == ["E: Unable to locate package cmake"]
    assert not machine.policy_rc_d.exists()


def test_a_pyenv_python_needs_no_python_packages(machine):
    machine.in_pyenv("3.12.1")
    machine.debian(machine.tmp / "usr-bin-python3.11")
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert not machine.apt_calls.exists()


# ------------------------------------------------------------ the venv

def test_a_half_made_venv_is_made_again(machine):
    machine.on_path("3.12.4")
    # What an interrupted `python -m venv` leaves: the config and a python, no pip.
    write_script(machine.venv / "bin" / "python", "exit 1\n")
    (machine.venv / "pyvenv.cfg").write_text("version = 3.12.4\n")
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert f"setup: {machine.venv} is half-made (its pip does not run); making it again" \
        in result.stdout
    assert subprocess.run([str(machine.venv / "bin" / "python"), "-m", "pip", "--version"],
                          env={"PATH": str(machine.tools)}).returncode == 0
