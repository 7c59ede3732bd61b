"""The three input modes: which examples each rank gets, step by step.

Examples are identified by their pixels (the tiny synthetic digits are all distinct),
so these tests check the batches the trainers would consume, not the index arithmetic.
"""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import flip_middle_4k, truncate_half
from hvd_mnist.data import splits, inputs
from hvd_mnist.errors import DataError, UserFacingError

BATCH = 20  # per rank


def example_ids(tiny_data_dir):
    """pixels -> position in the split as memory mode loads it."""
    split = splits.load_split(tiny_data_dir, "train")
    return {image.tobytes(): i for i, image in enumerate(split.images)}


def batches_of_every_rank(mode, data_dir, size, ids, *, epoch=1, per_rank=BATCH, buffer=480,
                          first_step=1):
    """[rank][step] -> list of example ids, and the steps every rank was given."""
    sources = [inputs.open_input(mode, data_dir, inputs.Shard(rank, size), buffer)
               for rank in range(size)]
    steps = sources[0].usable_train_examples() // (per_rank * size)
    per_rank_batches = []
    for source in sources:
        batches = []
        for images, labels in source.train_batches(seed=5, epoch=epoch, steps=steps,
                                                   per_rank_batch_size=per_rank,
                                                   first_step=first_step):
            assert images.dtype == tf.float32 and labels.dtype == tf.int64
            pixels = np.rint(images.numpy() * 255).astype(np.uint8)
            batches.append([ids[image.tobytes()] for image in pixels])
        per_rank_batches.append(batches)
    return per_rank_batches, steps


@pytest.mark.parametrize("mode,size", [("stream", 1), ("stream", 2), ("stream", 4),
                                       ("files", 1), ("files", 2), ("files", 4)])
def test_every_rank_runs_the_same_steps_and_no_example_is_used_twice(
        tiny_data_dir, tiny_sharded_data_dir, mode, size):
    data_dir = tiny_data_dir if mode == "stream" else tiny_sharded_data_dir
    ids = example_ids(data_dir)
    per_rank, steps = batches_of_every_rank(mode, data_dir, size, ids)
    assert steps == 480 // (BATCH * size)  # 4 files of 120: they divide evenly here
    assert all(len(batches) == steps for batches in per_rank), "unequal steps"
    assert all(len(batch) == BATCH for batches in per_rank for batch in batches)
    used = [i for batches in per_rank for batch in batches for i in batch]
    assert len(set(used)) == len(used) == steps * BATCH * size  # none twice, none skipped


@pytest.mark.parametrize("mode", ["memory", "stream", "files"])
@pytest.mark.parametrize("first_step", [2, 12, 13])  # the second, the last, none left
def test_an_epoch_started_at_step_s_gives_the_batches_from_step_s_on(
        tiny_data_dir, tiny_sharded_data_dir, mode, first_step):
    data_dir = tiny_sharded_data_dir if mode == "files" else tiny_data_dir
    ids = example_ids(data_dir)
    whole, steps = batches_of_every_rank(mode, data_dir, 2, ids)
    rest, _ = batches_of_every_rank(mode, data_dir, 2, ids, first_step=first_step)
    assert steps == 12 and rest == [batches[first_step - 1:] for batches in whole]


def test_stream_gives_the_same_global_batch_at_any_size(tiny_data_dir):
    ids = example_ids(tiny_data_dir)
    global_batch = 40

    def global_batches(size):
        per_rank, steps = batches_of_every_rank("stream", tiny_data_dir, size, ids,
                                                per_rank=global_batch // size)
        return [sorted(i for batches in per_rank for i in batches[t]) for t in range(steps)]

    reference = global_batches(1)
    assert global_batches(2) == reference and global_batches(4) == reference


def test_stream_order_is_tf_data_shuffle_not_memory_modes_permutation(tiny_data_dir):
    # A whole-split buffer gives a uniformly shuffled epoch, like memory mode, but drawn
    # by tf.data from (seed, epoch): another (equally -np-invariant) order.
    ids = example_ids(tiny_data_dir)
    (stream,), _ = batches_of_every_rank("stream", tiny_data_dir, 1, ids)
    memory = splits.epoch_permutation(5, 1, 480)[:len(stream) * BATCH].reshape(-1, BATCH)
    assert [sorted(b) for b in stream] != [sorted(b) for b in memory.tolist()]
    (again,), _ = batches_of_every_rank("stream", tiny_data_dir, 1, ids)
    (next_epoch,), _ = batches_of_every_rank("stream", tiny_data_dir, 1, ids, epoch=2)
    assert stream == again and stream != next_epoch


def test_files_mode_reads_only_its_own_files(tiny_sharded_data_dir):
    # At 4 workers rank r reads exactly file r; at 2, rank r reads files r and r + 2.
    ids = example_ids(tiny_sharded_data_dir)
    files, _ = batches_of_every_rank("files", tiny_sharded_data_dir, 4, ids, per_rank=10)
    files = [{i for batch in batches for i in batch} for batches in files]
    assert all(len(f) == 120 for f in files)
    halves, _ = batches_of_every_rank("files", tiny_sharded_data_dir, 2, ids)
    halves = [{i for batch in batches for i in batch} for batches in halves]
    assert halves == [files[0] | files[2], files[1] | files[3]]


def test_files_mode_needs_a_file_per_worker(tiny_data_dir):
    with pytest.raises(UserFacingError, match=r"--input=files needs the train split in at "
                                              r"least 2 files .* has 1; prepare it with"):
        inputs.open_input("files", tiny_data_dir, inputs.Shard(0, 2), 100)


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_eval_shards_cover_the_test_split_once(tiny_data_dir, mode):
    seen = []
    for rank in range(3):
        source = inputs.open_input(mode, tiny_data_dir, inputs.Shard(rank, 3), 100)
        assert source.num_test_examples == 100
        seen += [image.tobytes() for images, _ in source.eval_batches(16)
                 for image in images.numpy()]
    assert len(seen) == len(set(seen)) == 100


def test_float64_input_for_the_float64_model(tiny_data_dir):
    source = inputs.open_input("stream", tiny_data_dir, inputs.Shard(0, 1), 100, tf.float64)
    images, _ = next(iter(source.eval_batches(8)))
    assert images.dtype == tf.float64 and float(tf.reduce_max(images)) <= 1.0


def test_stream_refuses_a_damaged_record_file_before_the_first_batch(tiny_data_dir, tmp_path):
    damaged = tmp_path / "tfds"
    shutil.copytree(tiny_data_dir, damaged)
    record = damaged / "mnist/3.0.1/mnist-train.tfrecord-00000-of-00001"
    flip_middle_4k(record)
    with pytest.raises(DataError) as error:
        inputs.open_input("stream", str(damaged), inputs.Shard(0, 2), 100)
    assert str(error.value) == (
        f"{record} is damaged (its sha256 is not the one recorded when it was written); "
        f"prepare it again with: make data (or: python -m hvd_mnist.prepare "
        f"--data_dir={damaged})")


def test_files_mode_checks_the_files_of_its_own_rank(tiny_sharded_data_dir, tmp_path):
    damaged = tmp_path / "tfds"
    shutil.copytree(tiny_sharded_data_dir, damaged)
    record = damaged / "mnist/3.0.1/mnist-train.tfrecord-00001-of-00004"  # rank 1's of 2
    recorded = os.path.getsize(record)
    truncate_half(record)
    inputs.open_input("files", str(damaged), inputs.Shard(0, 2), 100)  # reads files 0 and 2
    with pytest.raises(DataError) as error:
        inputs.open_input("files", str(damaged), inputs.Shard(1, 2), 100)
    assert str(error.value).startswith(
        f"{record} is damaged ({recorded // 2} bytes, {recorded} when it was written); "
        "prepare it again with: make data")
