"""Files in model_dir: written whole or not at all, and a failed write is one line."""

import json
import os
import subprocess

import pytest

from hvd_mnist.outputs import files
from hvd_mnist.errors import UserFacingError


def test_write_json_replaces_the_file_whole(tmp_path):
    path = tmp_path / "summary.json"
    files.write_json(str(path), {"epoch": 1})
    files.write_json(str(path), {"epoch": 2})
    assert json.loads(path.read_text()) == {"epoch": 2}
    assert os.listdir(tmp_path) == ["summary.json"], "a temporary file was left behind"


def test_full_disk_is_one_line_and_the_old_file_survives(small_disk):
    disk = small_disk("64k")
    path = disk / "summary.json"
    files.write_json(str(path), {"epoch": 1})
    with pytest.raises(UserFacingError) as error:
        files.write_json(str(path), {"history": ["x" * 100_000]})
    assert str(error.value) == (f"cannot write {path} (No space left on device); free space "
                                "or fix the directory, then run again (with --resume to "
                                "continue)")
    assert json.loads(path.read_text()) == {"epoch": 1}
    assert os.listdir(disk) == ["summary.json"]


def test_unwritable_directory_is_one_line(tmp_path):
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(tmp_path)], capture_output=True).returncode:
            pytest.skip("chattr +i is not supported on this filesystem")
        expected = "Operation not permitted"
    else:
        os.chmod(tmp_path, 0o555)
        expected = "Permission denied"
    try:
        with pytest.raises(UserFacingError, match=rf"cannot write {tmp_path}/config.json "
                                                  rf"\({expected}\)"):
            files.write_json(str(tmp_path / "config.json"), {})
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path)], capture_output=True)
        os.chmod(tmp_path, 0o755)
