"""What horovodrun asks before every job (was Horovod built with Gloo? with MPI?), as
tools/horovod-patches/launcher-build-checks-recorded.patch answers it: the first check after
the library was built imports TensorFlow in a forked process, as Horovod always did; later
ones read the answer recorded beside the library. Unpatched, every horovodrun paid that
import: 3.8-5.2 s of CPU before any worker started, 1.0-1.2 s patched (BUILD_NOTES.md,
the patches)."""

import json
import os
import subprocess
import sys

import pytest
from horovod.common import util


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A stand-in for horovod/tensorflow's compiled library, and a count of the checks that
    started a process to import it."""
    path = tmp_path / "mpi_lib.so"
    path.write_bytes(b"\0" * 64)
    asked = []

    def check_in_new_process(ext_base_name, fn, fn_desc, verbose):
        asked.append(fn_desc)
        return answers.get(fn_desc)

    answers = {"built with Gloo": True, "built with MPI": False, "running with GPU": False}
    monkeypatch.setattr(util, "_extension_library", lambda ext_base_name: str(path))
    monkeypatch.setattr(util, "_check_extension_in_new_process", check_in_new_process)
    return path, asked, answers


def check(fn_desc, verbose=False):
    return util._check_extension_lambda("tensorflow", None, fn_desc, verbose)


def test_the_first_check_asks_and_later_ones_read_the_record(library):
    path, asked, _ = library
    assert check("built with Gloo") is True
    assert check("built with Gloo") is True
    assert check("built with MPI") is False
    assert check("built with MPI") is False
    assert asked == ["built with Gloo", "built with MPI"]
    assert os.path.exists(f"{path}.build-checks.json")


def test_a_rebuilt_library_is_asked_again(library):
    path, asked, answers = library
    assert check("built with Gloo") is True
    path.write_bytes(b"\1" * 80)  # another build: another size and modification time
    answers["built with Gloo"] = False
    assert check("built with Gloo") is False
    assert asked == ["built with Gloo", "built with Gloo"]


def test_a_failed_import_is_not_recorded(library):
    _, asked, answers = library
    answers["built with Gloo"] = None  # the forked import raised
    assert check("built with Gloo") is None
    assert check("built with Gloo") is None
    assert asked == ["built with Gloo", "built with Gloo"]


def test_a_library_that_does_not_exist_is_not_imported(library):
    path, asked, _ = library
    path.unlink()
    assert check("built with Gloo") is None
    assert asked == []


def test_the_gpu_and_a_verbose_check_are_asked_every_time(library):
    _, asked, _ = library
    check("running with GPU"), check("running with GPU")
    check("built with Gloo", verbose=True), check("built with Gloo", verbose=True)
    assert asked == ["running with GPU"] * 2 + ["built with Gloo"] * 2


def test_an_unwritable_record_leaves_the_answer_right(library, tmp_path):
    path, asked, _ = library
    os.mkdir(f"{path}.build-checks.json")  # a directory where the record would go
    assert check("built with Gloo") is True
    assert check("built with Gloo") is True
    assert asked == ["built with Gloo"] * 2


def test_horovodrun_reads_the_record_of_this_venvs_build():
    """The real library of this venv: after one launch, its Gloo answer is recorded."""
    bin_dir = os.path.dirname(sys.executable)
    result = subprocess.run([os.path.join(bin_dir, "horovodrun"), "--gloo", "-np", "1",
                             "-H", "localhost:1", sys.executable, "-c", "pass"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    record = util._extension_library("tensorflow") + ".build-checks.json"
    with open(record) as f:
        assert any(key.startswith("built with Gloo|") for key in json.load(f))
