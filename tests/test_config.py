"""Batch-size, learning-rate and step-count arithmetic."""

import pytest

from hvd_mnist import config
from hvd_mnist.errors import UserFacingError


def make(**overrides):
    return config.TrainConfig(data_dir="d", model_dir="m", **overrides)


def test_per_worker_batch_scales_global_batch_and_learning_rate():
    b = config.resolve_batching(make(batch_size=128), size=4)
    assert (b.per_rank_batch_size, b.global_batch_size, b.learning_rate) == (128, 512, 4.0)


def test_global_batch_is_split_and_learning_rate_kept():
    b = config.resolve_batching(make(global_batch_size=64, learning_rate=0.5), size=4)
    assert (b.per_rank_batch_size, b.global_batch_size, b.learning_rate) == (16, 64, 0.5)


def test_default_learning_rate_follows_optimizer():
    assert config.resolve_batching(make(optimizer="adam"), size=2).learning_rate == 0.002


def test_global_batch_not_divisible_by_workers_is_rejected():
    with pytest.raises(UserFacingError, match="--global_batch_size=64 is not divisible by the 3"):
        config.resolve_batching(make(global_batch_size=64), size=3)


@pytest.mark.parametrize("num_examples,global_batch,cap,expected", [
    (60_000, 512, 0, 117),   # remainder dropped
    (60_000, 500, 0, 120),   # exact
    (60_000, 512, 117, 117),  # cap equal to a full epoch
    (60_000, 512, 5, 5),
    (512, 512, 0, 1),        # one batch exactly
])
def test_steps_per_epoch(num_examples, global_batch, cap, expected):
    assert config.resolve_steps_per_epoch(num_examples, global_batch, cap) == expected


def test_batch_larger_than_dataset_is_rejected():
    with pytest.raises(UserFacingError, match="larger than the 511 training examples"):
        config.resolve_steps_per_epoch(511, 512)


def test_steps_per_epoch_beyond_an_epoch_is_rejected():
    with pytest.raises(UserFacingError, match="--max_steps_per_epoch=118 is more than one epoch"):
        config.resolve_steps_per_epoch(60_000, 512, 118)


def test_accumulation_rounds_a_full_epoch_down_to_whole_updates():
    assert config.resolve_steps_per_epoch(60_000, 256, passes_per_update=4) == 232  # of 234
    assert config.resolve_steps_per_epoch(60_000, 256, 8, passes_per_update=4) == 8


def test_a_cap_that_splits_an_update_is_rejected():
    with pytest.raises(UserFacingError, match="--max_steps_per_epoch=6 is not a multiple of "
                                              "--backward_passes_per_step=4"):
        config.resolve_steps_per_epoch(60_000, 256, 6, passes_per_update=4)


def test_a_config_that_breaks_a_rule_cannot_be_built():
    assert config.problems(make()) == []
    with pytest.raises(UserFacingError, match="^2 flag values do not work: flag --batch_size=0: "
                                              "0 is not a positive integer; "
                                              "--learning_rate must be > 0$"):
        make(batch_size=0, learning_rate=-1.0)
    with pytest.raises(UserFacingError, match="^flag --checkpoint_every_minutes=-1.5: -1.5 is "
                                              "not a non-negative number$"):
        make(checkpoint_every_minutes=-1.5)
