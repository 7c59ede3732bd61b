"""Keras 3 (TF 2.21, the default) and Keras 2 (TF 2.15; tf-keras on 2.16-2.19) behind one
adapter: which Keras a process gets, dropout that can be reseeded and that a broadcast leaves
alone, loss scaling around Horovod's optimizer, and one clear line where tf.keras cannot be
imported. That gradients really
are averaged on both paths is proven by tests/test_parity.py (planted bugs included)."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from hvd_mnist.training import model as model_lib
from hvd_mnist.worker import keras_compat

TF_KERAS_INSTALLED = importlib.util.find_spec("tf_keras") is not None
TF_MINOR = int(tf.__version__.split(".")[1])


def test_keras_3_unless_tf_keras_is_installed_or_tensorflow_is_2_15():
    expect_keras3 = TF_MINOR >= 16 and not TF_KERAS_INSTALLED
    assert keras_compat.is_keras3() == expect_keras3, keras_compat.keras_version()


def test_the_variable_is_set_exactly_where_tf_keras_stands_beside_keras3():
    # TF 2.15 honours the variable too, and would then look for tf-keras.
    setting = os.environ.get(keras_compat.VARIABLE)
    if TF_MINOR >= 16 and TF_KERAS_INSTALLED:
        assert setting in keras_compat.ON_VALUES
    else:
        assert setting is None


def test_the_dropout_streams_are_the_variables_a_broadcast_must_leave_alone():
    model = model_lib.build_model()
    streams = keras_compat.dropout_streams(model)
    if keras_compat.is_keras3():  # one seed state per Dropout layer, among the model's variables
        dropouts = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.Dropout)]
        assert len(streams) == len(dropouts) == 2
        keys = {id(v) for v in model.variables}
        assert all(id(stream) in keys for stream in streams)
    else:  # Keras 2's stateful generators keep theirs outside the model's variables
        assert streams == []
    assert keras_compat.dropout_streams(model_lib.build_model(dropout=False)) == []


def test_a_loss_scale_optimizer_sees_the_gradients_horovod_averaged():
    wrapped = []

    def wrap(optimizer):
        wrapped.append(optimizer)
        return optimizer

    optimizer = keras_compat.loss_scaled(wrap, tf.keras.optimizers.SGD())
    if keras_compat.is_keras3():  # Horovod averages in the loss-scale optimizer's apply()
        assert isinstance(wrapped[0], tf.keras.mixed_precision.LossScaleOptimizer)
        assert optimizer is wrapped[0]
    else:  # Keras 2's asks the optimizer inside it, which Horovod's averages
        assert isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        assert isinstance(wrapped[0], tf.keras.optimizers.SGD)


def test_a_reseeded_dropout_layer_draws_the_same_mask_again():
    layer = keras_compat.dropout_layer(0.5, tf.float32)
    ones = tf.ones([4, 64])
    keras_compat.reseed_dropout(layer, 1234)
    first = layer(ones, training=True).numpy()
    second = layer(ones, training=True).numpy()
    keras_compat.reseed_dropout(layer, 1234)
    again = layer(ones, training=True).numpy()
    assert not np.array_equal(first, second), "the stream did not move on"
    assert np.array_equal(first, again)


def test_per_epoch_model_files_are_in_the_format_of_this_keras():
    expected = ".keras" if keras_compat.is_keras3() else ".h5"
    assert keras_compat.model_file_suffix() == expected


def test_tf_keras_asked_for_but_missing_is_one_line(tiny_data_dir, tmp_path):
    # sys.modules[name] = None makes `import tf_keras` fail as if it were not installed.
    launcher = ("import sys; sys.modules['tf_keras'] = None; "
                "from hvd_mnist import main; main.run()")
    result = subprocess.run(
        [sys.executable, "-c", launcher, f"--data_dir={tiny_data_dir}",
         f"--model_dir={tmp_path}/model"], capture_output=True, text=True, timeout=120,
        env={**os.environ, keras_compat.VARIABLE: "1"})
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "hvd_mnist: error:" in line]
    minor = ".".join(tf.__version__.split(".")[:2])
    assert lines == [
        f"hvd_mnist: error: tf.keras cannot be imported: {keras_compat.VARIABLE}=1 asks for "
        f"tf-keras, which is not installed; unset {keras_compat.VARIABLE} to use the Keras "
        f"TensorFlow brings, or pip install 'tf-keras~={minor}.0'"], result.stderr[-3000:]
    assert not (tmp_path / "model").exists()
