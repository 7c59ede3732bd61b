"""A quiet start: TensorFlow's native INFO lines are dropped, everything else on stderr is
kept (hvd_mnist/worker/quiet.py)."""

import os

from hvd_mnist.worker import quiet

NATIVE_STDERR = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    b"I0000 00:00:1796190803.950159   10749 port.cc:153] oneDNN custom operations are on.\n"
    b"W0000 00:00:1796190803.950160   10749 cpu_feature_guard.cc:1] a warning stays\n"
    b"E0000 00:00:1796190803.950161   10749 loader.cc:2] an error stays\n")


def test_native_info_lines_are_dropped_and_warnings_errors_and_tracebacks_kept(capfd):
    with quiet.native_info_lines_dropped():
        os.write(2, NATIVE_STDERR + b"Traceback (most recent call last):\n")
    assert capfd.readouterr().err.splitlines() == [
        "W0000 00:00:1796190803.950160   10749 cpu_feature_guard.cc:1] a warning stays",
        "E0000 00:00:1796190803.950161   10749 loader.cc:2] an error stays",
        "Traceback (most recent call last):"]


def test_what_the_body_raises_still_leaves_stderr_as_it_was(capfd):
    try:
        with quiet.native_info_lines_dropped():
            os.write(2, b"E0000 00:00:1.0 x.cc:1] said before the error\n")
            raise ValueError("raised in the body")
    except ValueError:
        pass
    os.write(2, b"after\n")
    assert capfd.readouterr().err.splitlines() == ["E0000 00:00:1.0 x.cc:1] said before the error",
                                                   "after"]
