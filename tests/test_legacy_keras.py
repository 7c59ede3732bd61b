"""Keras 2 or nothing: hvd_mnist trains on tf.keras = Keras 2 under every supported
TensorFlow, and refuses to start on Keras 3, where Horovod 0.28.1's
DistributedOptimizer lets fit() run without averaging gradients."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from conftest import horovodrun, trainer_command
from hvd_mnist import legacy_keras

KERAS3_TF = int(tf.__version__.split(".")[1]) >= 16
needs_keras3_tf = pytest.mark.skipif(
    not KERAS3_TF, reason=f"TensorFlow {tf.__version__} has no Keras 3 to refuse; "
    "run with make test TF=2.18")


def test_hvd_mnist_processes_get_keras2():
    version = legacy_keras.keras_version_of(tf)
    assert version.startswith("2."), version
    legacy_keras.require_keras2()


def test_the_variable_is_set_exactly_where_keras_is_keras3():
    # TF 2.15 honours the variable too, and would then look for tf-keras.
    setting = os.environ.get(legacy_keras.VARIABLE)
    if KERAS3_TF:
        assert setting in legacy_keras.ON_VALUES
    else:
        assert setting is None


@pytest.mark.parametrize("keras_version", ["2.15.0", "2.18.0"])
def test_keras2_is_accepted(keras_version):
    assert legacy_keras.keras2_problem("2.18.1", keras_version, True, "1") is None
    assert legacy_keras.keras2_problem("2.15.1", keras_version, False, None) is None


def test_missing_tf_keras_says_what_to_install():
    problem = legacy_keras.keras2_problem("2.18.1", None, False, "1")
    assert "does not average gradients" in problem
    assert "pip install 'tf-keras~=2.18.0'" in problem


def test_keras3_without_tf_keras_says_what_to_install_and_set():
    problem = legacy_keras.keras2_problem("2.18.1", "3.8.0", False, "0")
    assert "pip install 'tf-keras~=2.18.0'" in problem
    assert problem.endswith("and set TF_USE_LEGACY_KERAS=1")


@pytest.mark.parametrize("setting", [None, "0", "false"])
def test_keras3_with_the_variable_off_says_what_to_set(setting):
    problem = legacy_keras.keras2_problem("2.18.1", "3.8.0", True, setting)
    assert f"set TF_USE_LEGACY_KERAS=1 (it is {setting!r})" in problem


def test_keras3_although_the_variable_is_on_means_tf_keras_was_used_first():
    problem = legacy_keras.keras2_problem("2.18.1", "3.8.0", True, "1")
    assert "tf.keras was first used before hvd_mnist set the variable" in problem


def error_lines(output):
    """hvd_mnist's error lines, with or without horovodrun's per-rank prefix."""
    return [line for line in output.splitlines() if "hvd_mnist: error:" in line]


@needs_keras3_tf
@pytest.mark.horovodrun
def test_every_rank_refuses_keras3_before_training(tiny_data_dir, tmp_path):
    result = horovodrun(2, trainer_command(f"--data_dir={tiny_data_dir}",
                                           f"--model_dir={tmp_path}/model", "--mode=keras"),
                        env={legacy_keras.VARIABLE: "0"})
    assert result.returncode != 0
    lines = error_lines(result.stdout + result.stderr)
    assert len(lines) == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert all("set TF_USE_LEGACY_KERAS=1 (it is '0')" in line for line in lines)
    assert "epoch" not in result.stdout.lower()
    assert not (tmp_path / "model").exists()


@needs_keras3_tf
def test_missing_tf_keras_is_refused_naming_the_package(tiny_data_dir, tmp_path):
    # sys.modules[name] = None makes `import tf_keras` fail as if it were not installed.
    launcher = ("import sys; sys.modules['tf_keras'] = None; "
                "from hvd_mnist import main; main.run()")
    args = [sys.executable, "-c", launcher, f"--data_dir={tiny_data_dir}",
            f"--model_dir={tmp_path}/model"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    [line] = error_lines(result.stderr)
    minor = ".".join(tf.__version__.split(".")[:2])
    assert f"pip install 'tf-keras~={minor}.0'" in line
