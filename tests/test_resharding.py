"""Where an elastic job goes on after a resize: the rest of an epoch split over the new
workers (hvd_mnist/data/resharding.py), checked without Horovod."""

import numpy as np
import pytest

from conftest import TINY_TRAIN
from hvd_mnist.data import resharding, splits


def union_of_ranks(order, start, end, per_rank_batch_size, size):
    steps = [resharding.rest_of_epoch(order, start, end, per_rank_batch_size, rank, size)
             for rank in range(size)]
    assert len({len(batches) for batches, _ in steps}) == 1, "ranks run different step counts"
    assert len({tuple(examples) for _, examples in steps}) == 1
    return np.concatenate([[]] + [b for batches, _ in steps for b in batches]), steps[0][1]


@pytest.mark.parametrize("size_before,size_after,steps_before", [
    (2, 1, 3), (1, 2, 5), (1, 2, 4), (2, 3, 1), (3, 2, 0)])
def test_resharding_covers_the_rest_of_the_epoch_exactly_once(size_before, size_after,
                                                             steps_before):
    order = splits.epoch_permutation(seed=7, epoch=2, num_examples=TINY_TRAIN)
    per_rank = 16
    end = (TINY_TRAIN // (per_rank * size_before)) * per_rank * size_before
    position = steps_before * per_rank * size_before
    before, _ = union_of_ranks(order, 0, position, per_rank, size_before)
    after, step_examples = union_of_ranks(order, position, end, per_rank, size_after)
    trained = np.concatenate([before, after])
    assert sorted(trained) == sorted(order[:end]) and len(set(trained)) == len(trained)
    assert sum(step_examples) == end - position


def test_an_epoch_from_position_0_is_a_normal_runs_epoch():
    order = splits.epoch_permutation(seed=42, epoch=3, num_examples=TINY_TRAIN)
    batches, _ = resharding.rest_of_epoch(order, 0, 15 * 32, 16, rank=1, size=2)
    normal = splits.train_epoch_indices(TINY_TRAIN, seed=42, epoch=3, steps=15,
                                      per_rank_batch_size=16, rank=1, size=2)
    assert np.array_equal(np.concatenate(batches), normal)


def test_a_short_last_step_may_leave_a_rank_an_empty_batch():
    split = splits.Split(np.zeros([10, 28, 28, 1], np.uint8), np.arange(10, dtype=np.int64))
    batches, step_examples = resharding.rest_of_epoch(np.arange(10), 6, 10, 2, rank=4, size=5)
    assert step_examples == [4] and [len(b) for b in batches] == [0]
    shapes = [images.shape[0] for images, _ in resharding.batches_dataset(split, batches, 2)]
    assert shapes == [0]
