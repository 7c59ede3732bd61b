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

# 0 shows everything, 1 hides INFO (I...), 2 also hides warnings, 3 also errors.
TF_CPP_QUIET_LEVEL = "1"


def before_tensorflow(environ=os.environ) -> None:
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", TF_CPP_QUIET_LEVEL)


def after_flags() -> None:
    """absl logging at WARNING unless --verbosity was given (TFDS logs every file at INFO)."""
    from absl import flags, logging
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def tfds_prints():
    """A context in which TFDS's own `Downloading and preparing dataset ...` and `Dataset
    ... downloaded and prepared` prints (plain prints, not logging) are dropped, unless
    --verbosity asked for INFO."""
    from absl import logging
    if logging.get_verbosity() >= logging.INFO:
        return contextlib.nullcontext()
    return contextlib.redirect_stdout(io.StringIO())
