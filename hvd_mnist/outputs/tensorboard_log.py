"""TensorBoard event files in model_dir/tensorboard, written by rank 0, for both paths.

Tags (`tensorboard --logdir runs/mnist/tensorboard`):
  train/loss, train/learning_rate, train/images_per_second
      every --log_every steps, at the step counted over the run; the loss and
      images/s are means over those steps and over all ranks
  epoch/train_loss, epoch/test_loss, epoch/test_accuracy, epoch/learning_rate,
  epoch/images_per_second
      once per epoch, at the epoch number
The Keras path writes the same tags through a callback instead of Keras's own
TensorBoard callback, so both paths can be compared in one view, and so that a
failed write stops every rank with one line (runtime.on_chief) instead of
rank 0 alone.
"""

import os

import tensorflow as tf

from hvd_mnist.outputs import files
from hvd_mnist.worker import runtime

TRAIN_TAGS = ("train/loss", "train/learning_rate", "train/images_per_second")
EPOCH_TAGS = ("epoch/train_loss", "epoch/test_loss", "epoch/test_accuracy",
              "epoch/learning_rate", "epoch/images_per_second")


def directory(model_dir: str) -> str:
    return os.path.join(model_dir, "tensorboard")


class TensorBoardLog:
    """Every rank calls every method at the same points; rank 0 writes."""

    def __init__(self, model_dir: str):
        self.directory = directory(model_dir)
        self._writer = None  # rank 0's, made at the first write

    def train_window(self, run_step: int, *, loss: float, learning_rate: float,
                     images_per_second: float) -> None:
        self._write(run_step, {"train/loss": loss, "train/learning_rate": learning_rate,
                               "train/images_per_second": images_per_second})

    def epoch(self, record: dict, learning_rate: float) -> None:
        """`record` as records.epoch_record makes it."""
        self._write(record["epoch"], {
            "epoch/train_loss": record["train_loss"], "epoch/test_loss": record["test_loss"],
            "epoch/test_accuracy": record["test_accuracy"], "epoch/learning_rate": learning_rate,
            "epoch/images_per_second": record["images_per_second"]})

    def _write(self, step: int, scalars: dict) -> None:
        def write():
            # Flushed at every write: a run killed mid-epoch still shows its curve so far.
            with files.writing(self.directory, also=(tf.errors.OpError,)):
                if self._writer is None:
                    self._writer = tf.summary.create_file_writer(self.directory)
                with self._writer.as_default():
                    for tag, value in scalars.items():
                        tf.summary.scalar(tag, value, step=step)
                self._writer.flush()

        runtime.on_chief(write)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

