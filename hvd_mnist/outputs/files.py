"""Files a run leaves in model_dir, and what a failed write of one looks like.

A write can fail at any time (disk full, quota, a permission or mount change,
the directory removed); each failure becomes one line naming the file and the
OS's reason, and a file that already existed is replaced only once its new
version is completely written.
"""

import contextlib
import json
import os

from hvd_mnist.errors import UserFacingError, short_reason


@contextlib.contextmanager
def writing(path: str, also: tuple = ()):
    """Turns an OSError (or one of `also`, such as TF's own I/O errors) inside the
    block into one line naming `path`."""
    try:
        yield
    except (OSError, *also) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else short_reason(e)
        raise UserFacingError(f"cannot write {path} ({reason}); free space or fix "
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
