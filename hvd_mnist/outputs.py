"""Files a run leaves in model_dir, and what a failed write of one looks like.

A write can fail at any time (disk full, quota, a permission or mount change,
the directory removed); each failure becomes one line naming the file and the
OS's reason, and a file that already existed is replaced only once its new
version is completely written.
"""

import contextlib
import json
import os

from hvd_mnist.errors import UserFacingError


@contextlib.contextmanager
def writing(path: str):
    """Turns an OSError inside the block into one line naming `path`."""
    try:
        yield
    except OSError as e:
        raise UserFacingError(f"cannot write {path} ({e.strerror or e}); free space or fix "
                              "the directory, then run again (with --resume to continue)"
                              ) from None


def write_json(path: str, value) -> None:
    """Writes `value` to a temporary file, then renames it over `path` (atomic on POSIX)."""
    temporary = f"{path}.tmp{os.getpid()}"
    with writing(path):
        try:
            with open(temporary, "w") as f:
                json.dump(value, f, indent=2)
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
