"""Sharding, ordering and preprocessing of the input pipeline."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import flip_middle_4k, truncate_half
from hvd_mnist import config
from hvd_mnist.data import splits, decoded
from hvd_mnist.errors import DataError


def shards(num_examples, per_rank_batch, size, epoch=1, seed=7):
    steps = config.resolve_steps_per_epoch(num_examples, per_rank_batch * size)
    order = splits.epoch_permutation(seed, epoch, num_examples)
    return steps, [splits.rank_batch_indices(order, steps, per_rank_batch, rank, size)
                   for rank in range(size)]


# Sizes chosen so the split does not divide evenly into global batches.
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_shards_are_disjoint_complete_and_equal_length(size):
    num_examples, per_rank_batch = 1003, 7
    steps, per_rank = shards(num_examples, per_rank_batch, size)
    assert steps == num_examples // (per_rank_batch * size)
    assert all(batches.shape == (steps, per_rank_batch) for batches in per_rank)
    seen = np.concatenate([b.reshape(-1) for b in per_rank])
    assert len(np.unique(seen)) == len(seen) == steps * per_rank_batch * size
    # Complete: exactly the first steps * global_batch examples of the epoch order.
    order = splits.epoch_permutation(7, 1, num_examples)
    assert set(seen) == set(order[:len(seen)])


def test_step_t_sees_the_same_global_batch_at_any_size():
    global_batch, num_examples = 60, 1003
    reference = None
    for size in (1, 2, 3, 4, 5):
        steps, per_rank = shards(num_examples, global_batch // size, size)
        union_per_step = [frozenset(np.concatenate([r[t] for r in per_rank]))
                          for t in range(steps)]
        if reference is None:
            reference = union_per_step
        assert union_per_step == reference, f"size {size} differs from size 1"


def test_order_depends_on_seed_and_epoch_only():
    a = splits.epoch_permutation(3, 1, 100)
    assert np.array_equal(a, splits.epoch_permutation(3, 1, 100))
    assert not np.array_equal(a, splits.epoch_permutation(3, 2, 100))
    assert not np.array_equal(a, splits.epoch_permutation(4, 1, 100))
    assert sorted(a) == list(range(100))


def test_eval_shards_cover_the_test_set_exactly_once():
    for size in (1, 2, 3, 4, 7):
        parts = [splits.eval_indices(10_000, rank, size) for rank in range(size)]
        assert sorted(np.concatenate(parts)) == list(range(10_000))


def test_normalize_maps_bytes_to_unit_floats():
    images = tf.constant([[[[0]], [[255]]]], tf.uint8)
    out, labels = splits.normalize(images, tf.constant([3], tf.int64))
    assert out.dtype == tf.float32
    assert out.numpy().min() == 0.0 and out.numpy().max() == 1.0
    assert labels.numpy().tolist() == [3]


def test_batches_keep_order_and_shape():
    images = np.arange(10, dtype=np.uint8).reshape(10, 1, 1, 1) * np.ones((1, 28, 28, 1), np.uint8)
    split = splits.Split(images, np.arange(10, dtype=np.int64))
    batches = list(splits.batches_from_indices(split, np.array([9, 0, 4, 5, 1]), 2))
    assert [b[1].numpy().tolist() for b in batches] == [[9, 0], [4, 5], [1]]
    assert batches[0][0].shape == (2, 28, 28, 1)
    assert batches[0][0].numpy()[0, 0, 0, 0] == pytest.approx(9 / 255)


def test_load_split_reads_prepared_tfds(tiny_data_dir):
    from conftest import TINY_TEST, TINY_TRAIN
    train = splits.load_split(tiny_data_dir, "train")
    test = splits.load_split(tiny_data_dir, "test")
    assert train.images.shape == (TINY_TRAIN, 28, 28, 1) and train.images.dtype == np.uint8
    assert len(test) == TINY_TEST and test.labels.dtype == np.int64
    assert set(train.labels) <= set(range(10))


def test_unprepared_data_dir_names_the_prepare_command(tmp_path):
    with pytest.raises(DataError, match="python -m hvd_mnist.prepare"):
        splits.check_prepared(str(tmp_path))


def test_decoded_copy_holds_what_tfds_decodes(tiny_data_dir):
    assert os.path.isfile(os.path.join(tiny_data_dir, decoded.DIRECTORY, "mnist-3.0.1",
                                       decoded.SOURCE_FILE))
    for split in ("train", "test"):
        fast, slow = splits.load_split(tiny_data_dir, split), splits.decode_split(tiny_data_dir, split)
        assert fast.images.dtype == slow.images.dtype == np.uint8
        assert fast.labels.dtype == slow.labels.dtype == np.int64
        assert np.array_equal(fast.images, slow.images)
        assert np.array_equal(fast.labels, slow.labels)


def test_without_a_decoded_copy_the_split_is_decoded_from_tfds(tiny_data_dir, tmp_path):
    copy = tmp_path / "tfds"
    shutil.copytree(tiny_data_dir, copy)
    shutil.rmtree(copy / decoded.DIRECTORY)
    assert np.array_equal(splits.load_split(str(copy), "test").images,
                          splits.load_split(tiny_data_dir, "test").images)


def copy_of(data_dir, tmp_path):
    copy = tmp_path / "tfds"
    shutil.copytree(data_dir, copy)
    return copy


def refusal(data_dir, split):
    """The one line load_split refuses `split` of data_dir with."""
    with pytest.raises(DataError) as error:
        splits.load_split(str(data_dir), split)
    return str(error.value)


def test_a_stale_decoded_copy_is_refused_in_one_line(tiny_data_dir, tmp_path):
    changed = copy_of(tiny_data_dir, tmp_path)
    record = changed / "mnist/3.0.1/mnist-train.tfrecord-00000-of-00001"
    record.write_bytes(record.read_bytes()[:-1] + b"x")  # same size, other bytes
    assert refusal(changed, "train") == (
        f"the decoded copy in {changed}/hvd_mnist_decoded/mnist-3.0.1 does not match the TFDS "
        f"files it was made from (train split changed since); make it again with: make data "
        f"(or: python -m hvd_mnist.prepare --data_dir={changed})")
    splits.load_split(str(changed), "test")  # the test split's files did not change


def test_truncated_record_file_is_one_line_asking_to_prepare_again(tiny_data_dir, tmp_path):
    damaged = tmp_path / "tfds"
    shutil.copytree(tiny_data_dir, damaged)
    shutil.rmtree(damaged / decoded.DIRECTORY)  # else the stale copy is refused first (above)
    record = damaged / "mnist/3.0.1/mnist-train.tfrecord-00000-of-00001"
    os.truncate(record, os.path.getsize(record) // 2)
    with pytest.raises(DataError) as error:
        splits.load_split(str(damaged), "train")
    message = str(error.value)
    assert "\n" not in message and "{{" not in message
    assert message.startswith(f"cannot read the train split of mnist from {damaged}/mnist/3.0.1/"
                              "mnist-train.tfrecord-* (Input dataset was expected to contain "
                              "480 elements but contained only")
    assert message.endswith(f"prepare them again with: make data (or: python -m "
                            f"hvd_mnist.prepare --data_dir={damaged})")


@pytest.mark.parametrize("damage,reason", [
    (flip_middle_4k, "its sha256 is not the one recorded when it was written"),
    (truncate_half, "{size} bytes, {recorded} when it was written"),
])
def test_a_damaged_decoded_copy_is_refused_in_one_line(tiny_data_dir, tmp_path, damage, reason):
    damaged = copy_of(tiny_data_dir, tmp_path)
    images = damaged / "hvd_mnist_decoded/mnist-3.0.1/train-images.tensor"
    recorded = os.path.getsize(images)
    damage(images)
    assert refusal(damaged, "train") == (
        f"{images} is damaged ({reason.format(size=os.path.getsize(images), recorded=recorded)}"
        f"); make the decoded copy again with: make data (or: python -m hvd_mnist.prepare "
        f"--data_dir={damaged})")
    splits.load_split(str(damaged), "test")  # the test split's files are intact


def test_a_decoded_copy_of_the_earlier_format_is_refused(tiny_data_dir, tmp_path):
    # Format 1 recorded no checksums of the copy's own files, so it cannot be checked.
    older = copy_of(tiny_data_dir, tmp_path)
    source = older / "hvd_mnist_decoded/mnist-3.0.1/source.json"
    source.write_text(source.read_text().replace('"format": 2', '"format": 1'))
    assert "(format 1, not 2); make it again with: make data" in refusal(older, "test")
