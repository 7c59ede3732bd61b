"""Restoring checkpoints: a damaged or foreign checkpoint is an error naming it, never a fresh start."""

import os

import pytest
import tensorflow as tf

from hvd_mnist import checkpoint, model as model_lib
from hvd_mnist.errors import UserFacingError


def make_store(model_dir, dense_units=128):
    model = model_lib.build_model()
    if dense_units != 128:  # the same layers, one of another shape: some other model
        layers = tf.keras.layers
        model = tf.keras.Sequential([
            tf.keras.Input(model_lib.INPUT_SHAPE), layers.Conv2D(32, 3), layers.Conv2D(64, 3),
            layers.MaxPooling2D(), layers.Dropout(0.25), layers.Flatten(),
            layers.Dense(dense_units), layers.Dropout(0.5), layers.Dense(10)])
    optimizer = model_lib.make_optimizer("adadelta", 1.0)
    optimizer.build(model.trainable_variables)
    return checkpoint.CheckpointStore(str(model_dir), model, optimizer, max_to_keep=3), model


def test_restore_returns_the_saved_epoch_and_weights(tmp_path):
    store, model = make_store(tmp_path)
    store.save(4)
    fresh_store, fresh_model = make_store(tmp_path)
    assert fresh_store.restore_latest() == 4
    assert all((a.numpy() == b.numpy()).all() for a, b in zip(model.weights, fresh_model.weights))


def test_no_checkpoint_means_epoch_0(tmp_path):
    assert make_store(tmp_path)[0].restore_latest() == 0


def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage,reason", [
    (lambda prefix: truncate(prefix + ".data-00000-of-00001"), "Read less bytes than requested"),
    (lambda prefix: truncate(prefix + ".index"), "not an sstable"),
    (lambda prefix: os.remove(prefix + ".index"), "ckpt-2"),
], ids=["truncated data", "truncated index", "missing index"])
def test_damaged_checkpoint_is_an_error_naming_it(tmp_path, damage, reason):
    store, _ = make_store(tmp_path)
    store.save(1)
    damage(store.save(2))
    with pytest.raises(UserFacingError, match=reason) as error:
        make_store(tmp_path)[0].restore_latest()
    message = str(error.value)
    assert message.startswith(f"cannot restore checkpoint {tmp_path}/checkpoints/ckpt-2 (")
    assert "\n" not in message and "delete them or use another --model_dir" in message


def test_checkpoint_of_another_model_shape_is_an_error(tmp_path):
    make_store(tmp_path, dense_units=64)[0].save(1)
    with pytest.raises(UserFacingError, match=r"ckpt-1 \(Received incompatible tensor with "
                                              r"shape \(64,\)"):
        make_store(tmp_path)[0].restore_latest()


def test_unreadable_state_file_is_an_error_not_a_fresh_start(tmp_path):
    store, _ = make_store(tmp_path)
    store.save(1)
    with open(tmp_path / "checkpoints/checkpoint", "w") as f:
        f.write("model_checkpoint_path: \"ckpt-1")  # cut off mid-line
    with pytest.raises(UserFacingError, match="checkpoints/checkpoint is damaged"):
        make_store(tmp_path)[0].restore_latest()
