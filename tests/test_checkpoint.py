"""Checkpoints: a damaged or foreign checkpoint is an error naming it, never a fresh start,
and a save that cannot be written leaves the previous checkpoint the latest."""

import os
import shutil

import pytest
import tensorflow as tf

from hvd_mnist import config as config_lib
from hvd_mnist.data import mnist
from hvd_mnist.outputs import checkpoint, position, run_identity
from hvd_mnist.training import model as model_lib
from hvd_mnist.errors import UserFacingError


def make_store(model_dir, dense_units=128, num_workers=1, **flags):
    model = model_lib.build_model()
    if dense_units != 128:  # the same layers, one of another shape: some other model
        layers = tf.keras.layers
        model = tf.keras.Sequential([
            tf.keras.Input(mnist.IMAGE_SHAPE), layers.Conv2D(32, 3), layers.Conv2D(64, 3),
            layers.MaxPooling2D(), layers.Dropout(0.25), layers.Flatten(),
            layers.Dense(dense_units), layers.Dropout(0.5), layers.Dense(10)])
    config = config_lib.TrainConfig(data_dir="", model_dir=str(model_dir), **flags)
    batching = config_lib.resolve_batching(config, num_workers)
    optimizer = model_lib.make_optimizer(config.optimizer, batching.learning_rate)
    optimizer.build(model.trainable_variables)
    run = run_identity.of_run(config, batching, num_workers, 10, model, optimizer)
    return checkpoint.CheckpointStore(str(model_dir), model, optimizer, 3, run), model


def test_restore_returns_the_saved_epoch_and_weights(tmp_path):
    store, model = make_store(tmp_path)
    store.save(4)
    fresh_store, fresh_model = make_store(tmp_path)
    restored = fresh_store.restore_latest()
    assert (restored.epoch, restored.path, restored.changes) == (4, store.latest, "")
    assert all((a.numpy() == b.numpy()).all() for a, b in zip(model.weights, fresh_model.weights))


def test_no_checkpoint_means_epoch_0(tmp_path):
    assert make_store(tmp_path)[0].restore_latest() == checkpoint.Restored(0)


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
    store, model = make_store(tmp_path)
    # Counted in model.variables, which on Keras 3 also holds each Dropout's seed.
    number = 1 + [list(v.shape) for v in model.variables].index([9216, 128])
    with pytest.raises(UserFacingError, match=rf"cannot resume from .*ckpt-1: it belongs to "
                                              rf"another run \(the model's variables differ: "
                                              rf"number {number} has shape \[9216, 64\] saved, "
                                              rf"\[9216, 128\] now; the optimizer's "
                                              rf"variables differ: number "):
        store.restore_latest()


def test_checkpoint_of_another_optimizer_is_refused_before_restoring(tmp_path):
    store, _ = make_store(tmp_path)  # adadelta
    store.save(1)
    adam_store, adam_model = make_store(tmp_path, optimizer="adam")
    weights_before = [w.numpy() for w in adam_model.weights]
    with pytest.raises(UserFacingError) as error:
        adam_store.restore_latest()
    assert str(error.value) == (
        f"cannot resume from {tmp_path}/checkpoints/ckpt-1: it belongs to another run "
        "(--optimizer was adadelta, now adam); resume with --optimizer=adadelta, or start "
        "afresh with another --model_dir")
    assert all((a == b.numpy()).all() for a, b in zip(weights_before, adam_model.weights))


def test_checkpoint_without_a_run_record_is_refused(tmp_path):
    store, model = make_store(tmp_path)
    old_style = tf.train.Checkpoint(model=model, epoch=store.epoch)  # as hvd_mnist 0.1 saved
    old_style.save(str(tmp_path / "checkpoints/ckpt"))
    tf.train.CheckpointManager(old_style, str(tmp_path / "checkpoints"), 3)  # state file
    with pytest.raises(UserFacingError, match="it records no run settings"):
        make_store(tmp_path)[0].restore_latest()


def test_allowed_changes_restore_and_say_when_results_change(tmp_path):
    make_store(tmp_path, num_workers=2)[0].save(1)
    quiet, _ = make_store(tmp_path, num_workers=2, log_every=7, keep_checkpoints=5, epochs=30)
    assert quiet.restore_latest().changes == ""
    more_workers, _ = make_store(tmp_path, num_workers=4, seed=7)
    assert more_workers.restore_latest().changes == (
        "resume changes global_batch_size from 256 to 512 (2 x 128 -> 4 x 128), "
        "learning_rate from 2.0 to 4.0, seed from 42 to 7: the result will differ from an "
        "uninterrupted run")


@pytest.mark.parametrize("flag,value,named", [
    ("backward_passes_per_step", 2, "backward_passes_per_step from 1 to 2"),
    ("fp16_allreduce", True, "fp16_allreduce from False to True"),
    ("input", "stream", "input from memory to stream"),
])
def test_a_resume_that_changes_how_gradients_or_batches_are_made_says_so(tmp_path, flag, value,
                                                                         named):
    make_store(tmp_path)[0].save(1)
    changed, _ = make_store(tmp_path, **{flag: value})
    assert changed.restore_latest().changes == (
        f"resume changes {named}: the result will differ from an uninterrupted run")


def test_a_resume_in_another_dtype_is_refused(tmp_path):
    make_store(tmp_path)[0].save(1)
    with pytest.raises(UserFacingError, match=r"\(--precision was float32, now float64\); "
                                              r"resume with --precision=float32"):
        make_store(tmp_path, precision="float64")[0].restore_latest()


def test_unreadable_state_file_is_an_error_not_a_fresh_start(tmp_path):
    store, _ = make_store(tmp_path)
    store.save(1)
    with open(tmp_path / "checkpoints/checkpoint", "w") as f:
        f.write("model_checkpoint_path: \"ckpt-1")  # cut off mid-line
    with pytest.raises(UserFacingError, match="checkpoints/checkpoint is damaged"):
        make_store(tmp_path)[0].restore_latest()


def test_full_disk_keeps_the_previous_checkpoint_and_removes_the_partial_one(small_disk):
    # Room for one checkpoint (14.4 MB: weights and Adadelta's two slots), not two.
    small_disk = small_disk("20m")
    store, model = make_store(small_disk)
    first = store.save(1)
    with pytest.raises(UserFacingError) as error:
        store.save(2)
    assert str(error.value) == (
        f"cannot write checkpoint {small_disk}/checkpoints/ckpt-2 (No space left on device); "
        f"the latest checkpoint is still {first}: free space or fix the directory, then "
        "continue with --resume")
    assert sorted(os.listdir(small_disk / "checkpoints")) == [
        "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    restored_store, restored_model = make_store(small_disk)
    assert restored_store.restore_latest().epoch == 1
    assert all((a.numpy() == b.numpy()).all()
               for a, b in zip(model.weights, restored_model.weights))


def test_a_mid_epoch_checkpoint_restores_its_position_and_the_epochs_loss_so_far(tmp_path):
    store, model = make_store(tmp_path)
    store.save(1)
    path = store.save_mid_epoch(position.after_step(epoch=2, step=4), 10, loss_sum=1.25)
    assert path == f"{tmp_path}/checkpoints/mid_epoch/step-14"
    restored = make_store(tmp_path)[0].restore_latest()
    assert (restored.position, restored.path, restored.loss_sum) == (
        position.Position(1, 4), path, 1.25)


def test_only_the_newest_mid_epoch_checkpoint_is_kept_until_its_epoch_ends(tmp_path):
    store, _ = make_store(tmp_path)
    store.save_mid_epoch(position.after_step(epoch=1, step=3), 10, 0.0)
    store.save_mid_epoch(position.after_step(epoch=1, step=6), 10, 0.0)
    assert sorted(os.listdir(tmp_path / "checkpoints/mid_epoch")) == [
        "checkpoint", "step-6.data-00000-of-00001", "step-6.index"]
    store.save(1)
    assert os.listdir(tmp_path / "checkpoints/mid_epoch") == []
    assert make_store(tmp_path)[0].restore_latest().position == position.Position(1)


def test_a_mid_epoch_checkpoint_its_epoch_checkpoint_outran_is_passed_over(tmp_path):
    make_store(tmp_path / "a")[0].save_mid_epoch(position.after_step(epoch=2, step=4), 10, 0.0)
    make_store(tmp_path / "b")[0].save(2)
    # Both, as a kill between writing ckpt-2 and removing the mid-epoch one leaves them.
    shutil.copytree(tmp_path / "a/checkpoints/mid_epoch", tmp_path / "b/checkpoints/mid_epoch")
    restored = make_store(tmp_path / "b")[0].restore_latest()
    assert (restored.position, restored.path) == (
        position.Position(2), f"{tmp_path}/b/checkpoints/ckpt-2")


def test_a_mid_epoch_resume_with_another_global_batch_is_refused(tmp_path):
    make_store(tmp_path, num_workers=2)[0].save_mid_epoch(position.after_step(1, 3), 10, 0.0)
    with pytest.raises(UserFacingError) as error:
        make_store(tmp_path, num_workers=4)[0].restore_latest()
    assert str(error.value) == (
        f"cannot resume mid-epoch from {tmp_path}/checkpoints/mid_epoch/step-3: its position "
        "counts steps of the run that wrote it (global_batch_size was 256, now 512); resume "
        "with that run's batch, -np and --max_steps_per_epoch, or delete the mid_epoch "
        "directory to resume from the last epoch checkpoint")
