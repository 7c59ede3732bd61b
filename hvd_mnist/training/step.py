"""One training step and one evaluation step, and the one place metrics meet over ranks.

`make_train_step` is one optimisation step, nothing else: local gradients,
averaged over ranks by Horovod's DistributedGradientTape, then applied. The loop
(loop.py), the elastic trainer and the tests build their steps here.
"""

import math

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_mnist.data import mnist
from hvd_mnist.errors import CollectiveError
from hvd_mnist.training import communication, model as model_lib
from hvd_mnist.worker import keras_compat

LABEL_SPEC = tf.TensorSpec([None], tf.int64)


def image_spec(model) -> tf.TensorSpec:
    """A batch of the model's inputs: any batch size, so the short last batch does not retrace."""
    return tf.TensorSpec([None, *mnist.IMAGE_SHAPE], model.inputs[0].dtype)


def make_train_step(model, optimizer, loss_fn, compression=hvd.Compression.none,
                    input_signature=None, requests=None):
    """One step: local gradients, averaged over ranks by Horovod, then applied (with
    mixed_float16, of the scaled loss, unscaled after the average: precision.py).

    Returns the loss averaged over ranks, so every rank sees the same value and
    takes the same decision about it. (What that scalar allreduce costs is below
    the run-to-run noise here, and riding it on the gradients' allreduce was no
    faster: docs/performance.md.) Autograph is off: the step has no Python control
    flow on tensors, and converting Keras's and Horovod's code took a second of
    tracing in every process.
    With `requests`, returns (loss, every rank's requests averaged) (preemption.py).
    """

    @tf.function(input_signature=input_signature or [image_spec(model), LABEL_SPEC],
                 autograph=False)
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            probabilities = model(images, training=True)
            loss = loss_fn(labels, probabilities)
            scaled_loss = keras_compat.scale_loss(optimizer, loss)  # mixed_float16 only
        # Horovod: the tape averages the ranks' gradients (the same on every rank).
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        # A LossScaleOptimizer skips a step whose averaged gradients are not finite, so
        # every rank skips it (precision.py).
        gradients = keras_compat.unscale_gradients(optimizer, gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return communication.average_loss(loss, requests)

    return train_step


def train_step_for(model, optimizer, *, backward_passes_per_step: int, fp16_allreduce: bool,
                   requests=None):
    """The run's step: plain, or accumulating `--backward_passes_per_step` batches per update;
    gradients sent as float16 with `--fp16_allreduce` (communication.py); with `requests`,
    it returns (loss, agreed requests) (preemption.py)."""
    compression = communication.compression(fp16_allreduce)
    if backward_passes_per_step > 1:
        return communication.make_accumulating_train_step(
            model, optimizer, model_lib.make_loss(), backward_passes_per_step,
            compression, [image_spec(model), LABEL_SPEC], requests)
    return make_train_step(model, optimizer, model_lib.make_loss(), compression, None, requests)


def make_eval_step(model):
    """Summed loss and number of correct predictions of one batch (no averaging)."""

    @tf.function(input_signature=[image_spec(model), LABEL_SPEC], autograph=False)
    def eval_step(images, labels):
        probabilities = model(images, training=False)
        losses = tf.keras.losses.sparse_categorical_crossentropy(labels, probabilities)
        correct = tf.equal(tf.argmax(probabilities, axis=1), labels)
        return tf.reduce_sum(losses), tf.reduce_sum(tf.cast(correct, tf.float32))

    return eval_step


def sum_across_ranks(values) -> np.ndarray:
    """Element-wise sum over all ranks, in float64 so counts stay exact."""
    # Horovod: the metric reduction, sums and counts over every rank's share of the test set.
    return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum,
                         name="metric_sums").numpy()


def evaluate(eval_step, dataset) -> dict:
    """Loss and accuracy over every rank's share of the test set together."""
    loss_sum = correct = examples = 0.0
    for images, labels in dataset:
        batch_loss, batch_correct = eval_step(images, labels)
        loss_sum += float(batch_loss)
        correct += float(batch_correct)
        examples += int(labels.shape[0])
    loss_sum, correct, examples = sum_across_ranks([loss_sum, correct, examples])
    return {"test_loss": loss_sum / examples, "test_accuracy": correct / examples,
            "test_examples": int(examples)}


def check_finite(loss: float, where: str) -> None:
    """`loss` is averaged over ranks, so every rank stops at the same step."""
    if not math.isfinite(loss):
        raise CollectiveError(f"training diverged: loss is {loss} at {where}; lower "
                              "--learning_rate or check the input data")


class DeferredLossCheck:
    """Checks each step's loss one step late.

    Reading the loss of the step just started would make the host wait for it
    (on a GPU, a stall); the previous step's loss is ready by then.
    """

    def __init__(self):
        self._loss, self._where = None, ""

    def push(self, loss, where: str) -> None:
        self.flush()
        self._loss, self._where = loss, where

    def flush(self) -> None:
        if self._loss is not None:
            check_finite(float(self._loss), self._where)
            self._loss = None
