"""The training and evaluation steps, in this process (Horovod with one rank)."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from hvd_mnist.data import mnist, splits
from hvd_mnist.training import model as model_lib, step as step_lib


@pytest.fixture(scope="module")
def tiny_splits(tiny_data_dir):
    hvd.init()
    return splits.load_split(tiny_data_dir, "train"), splits.load_split(tiny_data_dir, "test")


def test_training_learns_without_retracing(tiny_splits):
    train_split, test_split = tiny_splits
    tf.keras.utils.set_random_seed(0)
    model = model_lib.build_model()
    optimizer = model_lib.make_optimizer("adadelta", 1.0)
    # As in the trainer: slots created up front, or the first call traces twice.
    optimizer.build(model.trainable_variables)
    step = step_lib.make_train_step(model, optimizer, model_lib.make_loss())
    eval_step = step_lib.make_eval_step(model)
    test_batches = splits.batches_from_indices(
        test_split, splits.eval_indices(len(test_split), 0, 1), 32)
    before = step_lib.evaluate(eval_step, test_batches)
    for epoch in (1, 2, 3):
        indices = splits.train_epoch_indices(len(train_split), seed=0, epoch=epoch, steps=15,
                                           per_rank_batch_size=32, rank=0, size=1)
        for images, labels in splits.batches_from_indices(train_split, indices, 32):
            loss = step(images, labels)
            assert np.isfinite(float(loss))
    after = step_lib.evaluate(eval_step, test_batches)
    assert step.experimental_get_tracing_count() == 1
    # The short last test batch (100 = 3 * 32 + 4) must not retrace either.
    assert eval_step.experimental_get_tracing_count() == 1
    assert after["test_examples"] == len(test_split) == before["test_examples"]
    assert after["test_loss"] < before["test_loss"]
    assert after["test_accuracy"] >= 0.9


def test_evaluate_counts_loss_and_correct_exactly(tiny_splits):
    _, test_split = tiny_splits
    model = model_lib.build_model()
    batches = splits.batches_from_indices(test_split, splits.eval_indices(len(test_split), 0, 1), 33)
    metrics = step_lib.evaluate(step_lib.make_eval_step(model), batches)
    probabilities = model(splits.normalize(test_split.images, test_split.labels)[0]).numpy()
    expected_accuracy = np.mean(probabilities.argmax(axis=1) == test_split.labels)
    expected_loss = -np.mean(np.log(probabilities[np.arange(len(test_split)), test_split.labels]))
    assert metrics["test_accuracy"] == pytest.approx(expected_accuracy, abs=1e-9)
    assert metrics["test_loss"] == pytest.approx(expected_loss, rel=1e-5)


def test_non_finite_loss_is_an_error_naming_where():
    with pytest.raises(Exception, match="loss is nan at epoch 2 step 40"):
        step_lib.check_finite(float("nan"), "epoch 2 step 40")


def test_dropout_masks_depend_only_on_the_reseed_words():
    model = model_lib.build_model()
    images = tf.ones([4, *mnist.IMAGE_SHAPE])

    def outputs_after_reseed(words, calls=2):
        model_lib.reseed_dropout(model, words)
        return [model(images, training=True).numpy() for _ in range(calls)]

    first, second = outputs_after_reseed((42, 0, 3))
    assert not np.array_equal(first, second), "masks must change from step to step"
    model(images, training=True)  # the stream moves on; a reseed must bring it back
    again = outputs_after_reseed((42, 0, 3))
    assert np.array_equal(first, again[0]) and np.array_equal(second, again[1])
    other_rank = outputs_after_reseed((42, 1, 3), calls=1)[0]
    other_epoch = outputs_after_reseed((42, 0, 4), calls=1)[0]
    assert not np.array_equal(first, other_rank) and not np.array_equal(first, other_epoch)


def test_a_reseed_past_s_steps_draws_the_masks_of_step_s_plus_1():
    model = model_lib.build_model()
    images = tf.ones([4, *mnist.IMAGE_SHAPE])
    model_lib.reseed_dropout(model, (42, 0, 3))
    uninterrupted = [model(images, training=True).numpy() for _ in range(4)]
    for steps_done in (0, 1, 3):  # none done, the first done, all but the last
        model(images, training=True)  # the stream moves on; the reseed must not care
        model_lib.reseed_dropout(model, (42, 0, 3), steps_done, per_rank_batch_size=4)
        assert np.array_equal(model(images, training=True).numpy(),
                              uninterrupted[steps_done]), steps_done


def test_warmup_linear_decay_schedule():
    schedule = model_lib.WarmupLinearDecay(peak=2.0, warmup_steps=4, total_steps=20)
    rates = [float(schedule(step)) for step in range(20)]
    assert rates[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])  # warm-up, peak at its last step
    assert all(a > b for a, b in zip(rates[3:], rates[4:]))  # then strictly decreasing
    assert rates[-1] == pytest.approx(2.0 / 17) and float(schedule(20)) == 0.0
