"""The CNN of Keras's and Horovod's MNIST examples, the loss, and the optimizers.

Every path (custom loop, Keras fit, benchmarks, tests) builds its model here,
so they all train exactly the same network.
"""

import tensorflow as tf

from hvd_mnist.data import mnist, splits
from hvd_mnist.training import precision as precision_lib
from hvd_mnist.worker import keras_compat


def build_model(dropout: bool = True, precision: str = "float32") -> tf.keras.Model:
    """Conv32-Conv64-MaxPool-Dropout-Dense128-Dropout-Dense10 (softmax).

    dropout=False keeps the layers but with rate 0, so weights and layer names
    are the same; tests use it to make training deterministic across paths.
    precision="float64" builds every layer, and so the optimizer's slots, in float64.
    A mixed `precision` (precision.py) is the policy of every layer but the last, whose
    softmax stays in float32.
    """
    dtype = precision_lib.variable_dtype(precision)
    keep = 1.0 if dropout else 0.0
    layers = tf.keras.layers
    hidden = precision_lib.layer_dtype(precision, dtype)
    return tf.keras.Sequential([
        tf.keras.Input(shape=mnist.IMAGE_SHAPE, dtype=dtype),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu", dtype=hidden),
        layers.Conv2D(64, (3, 3), activation="relu", dtype=hidden),
        layers.MaxPooling2D(pool_size=(2, 2), dtype=hidden),
        keras_compat.dropout_layer(0.25 * keep, hidden),
        layers.Flatten(dtype=hidden),
        layers.Dense(128, activation="relu", dtype=hidden),
        keras_compat.dropout_layer(0.5 * keep, hidden),
        layers.Dense(mnist.NUM_CLASSES, activation="softmax", dtype=dtype),
    ], name="mnist_cnn")


def reseed_dropout(model: tf.keras.Model, seed_words: tuple, steps_done: int = 0,
                   per_rank_batch_size: int = 0) -> None:
    """Restarts every Dropout layer's random stream from a seed made of `seed_words`,
    moved on past the masks of `steps_done` training steps of `per_rank_batch_size`
    examples (one mask per layer and step).

    A stream that just ran on would leave a resumed run drawing other masks than
    the run it replaces. Restarting each layer's stream from, say, (seed, rank,
    epoch) at every epoch start makes the mask of every step a pure function of
    where the step is, however the run got there, mid-epoch resumes included.
    """
    dropouts = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.Dropout)]
    for index, layer in enumerate(dropouts):
        keras_compat.reseed_dropout(layer, splits.seed_from_words([*seed_words, index]),
                                    steps_done, per_rank_batch_size)


def make_loss():
    """Mean sparse categorical cross-entropy over the batch, from probabilities."""
    return tf.keras.losses.SparseCategoricalCrossentropy()


def optimizer_recipe(name: str, learning_rate) -> tuple[type, dict]:
    """The optimizer's class and constructor arguments (the Keras path subclasses the class)."""
    optimizers = tf.keras.optimizers
    if name == "adadelta":
        return optimizers.Adadelta, {"learning_rate": learning_rate}
    if name == "adam":
        return optimizers.Adam, {"learning_rate": learning_rate}
    if name == "sgd":
        return optimizers.SGD, {"learning_rate": learning_rate, "momentum": 0.9}
    raise ValueError(f"unknown optimizer {name!r}")


def make_optimizer(name: str, learning_rate) -> tf.keras.optimizers.Optimizer:
    optimizer_class, arguments = optimizer_recipe(name, learning_rate)
    return optimizer_class(**arguments)


class WarmupLinearDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak` over `warmup_steps`, then linear decay to 0 at `total_steps`.

    Warm-up keeps the large early steps of a scaled-up learning rate from
    diverging; decaying to zero by the last step lets a short run settle.
    """

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        super().__init__()
        self.peak, self.warmup_steps, self.total_steps = peak, warmup_steps, total_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0  # the rate used by the step-th update
        warmup = step / max(self.warmup_steps, 1)
        decay = (self.total_steps + 1 - step) / (self.total_steps - self.warmup_steps + 1)
        return self.peak * tf.clip_by_value(tf.minimum(warmup, decay), 0.0, 1.0)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}
