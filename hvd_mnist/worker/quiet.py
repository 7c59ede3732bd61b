"""A quiet start: no TensorFlow or TFDS INFO lines unless asked for; warnings and errors stay.

Every entry point (main, prepare, predict) calls `before_tensorflow()` before anything
imports TensorFlow (TF reads the variable once, when it loads), and `after_flags()` once
absl has parsed its flags. To see the INFO lines again:
  TF_CPP_MIN_LOG_LEVEL=0   TensorFlow's C++ lines (cpu_feature_guard, oneDNN, ...)
  --verbosity=0 (-v 0)     absl's flag: TFDS's and TensorFlow's Python INFO lines
"""

import contextlib
import io
import os
import re
import sys
import tempfile

# 0 shows everything, 1 hides INFO (I...), 2 also hides warnings, 3 also errors.
TF_CPP_QUIET_LEVEL = "1"
# TF 2.21's native libraries log their oneDNN notice through absl before absl's logging
# is set up, so TF_CPP_MIN_LOG_LEVEL does not reach it: these lines, twice per import.
ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called"
NATIVE_INFO_LINE = re.compile(r"I\d{4} \d\d:\d\d:\d\d")


def before_tensorflow(environ=os.environ) -> None:
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", TF_CPP_QUIET_LEVEL)


def after_flags(environ=os.environ) -> None:
    """absl logging at WARNING unless --verbosity was given (TFDS logs every file at INFO),
    then TensorFlow imported without its INFO lines (after the flags, so that --help and a
    bad flag answer at once)."""
    from absl import flags, logging
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if environ.get("TF_CPP_MIN_LOG_LEVEL", "0") != "0" and "tensorflow" not in sys.modules:
        with native_info_lines_dropped():
            import tensorflow  # noqa: F401


@contextlib.contextmanager
def native_info_lines_dropped():
    """Runs the body with file descriptor 2 captured, then writes every captured line to
    stderr except native INFO lines and absl's preamble to them; warnings, errors and
    tracebacks come through, after the body."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not (line.startswith(ABSL_PREAMBLE) or NATIVE_INFO_LINE.match(line)):
                    sys.stderr.write(line)
            sys.stderr.flush()


def tfds_prints():
    """A context in which TFDS's own `Downloading and preparing dataset ...` and `Dataset
    ... downloaded and prepared` prints (plain prints, not logging) are dropped, unless
    --verbosity asked for INFO."""
    from absl import logging
    if logging.get_verbosity() >= logging.INFO:
        return contextlib.nullcontext()
    return contextlib.redirect_stdout(io.StringIO())
