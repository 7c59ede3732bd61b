"""TensorFlow runs oneDNN's kernels in every hvd_mnist process on x86-64, unless the user
says otherwise (hvd_mnist/worker/cpu_kernels.py)."""

import platform
import subprocess
import sys

import pytest

from hvd_mnist.worker import cpu_kernels

ONEDNN_ENABLED = ("import hvd_mnist, tensorflow; "
                  "from tensorflow.python.util import _pywrap_util_port as port; "
                  "print(port.IsMklEnabled())")


def test_onednn_is_asked_for_on_x86_64():
    environ = {}
    cpu_kernels.prefer_onednn(environ, machine="x86_64")
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": "1"}


def test_the_users_setting_wins():
    environ = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    cpu_kernels.prefer_onednn(environ, machine="x86_64")
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": "0"}


def test_other_machines_keep_tensorflows_default():
    environ = {}
    cpu_kernels.prefer_onednn(environ, machine="aarch64")
    assert environ == {}


def onednn_enabled_in_a_new_process(env: dict) -> bool:
    """What TensorFlow itself says in a process that imports hvd_mnist, then TensorFlow."""
    out = subprocess.run([sys.executable, "-c", ONEDNN_ENABLED], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return out[-1] == "True"


@pytest.mark.skipif(platform.machine() not in cpu_kernels.X86_64, reason="x86-64 only")
def test_tensorflow_takes_it_when_hvd_mnist_is_imported_first():
    base = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"}
    assert onednn_enabled_in_a_new_process(base)
    assert not onednn_enabled_in_a_new_process({**base, "TF_ENABLE_ONEDNN_OPTS": "0"})
