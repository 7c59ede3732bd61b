"""The trainers' model, optimizer and loss on one random batch: a training step with no
input pipeline and no Horovod, for what the bench times in one process (plain TF, the
step's breakdown, the scaling probe's compute)."""

import dataclasses

import tensorflow as tf

from hvd_mnist.data import mnist
from hvd_mnist.training import model as model_lib


@dataclasses.dataclass
class SyntheticTraining:
    model: tf.keras.Model
    optimizer: tf.keras.optimizers.Optimizer
    loss_fn: object
    variables: list  # the trainable weights
    images: tf.Tensor
    labels: tf.Tensor

    def step_function(self):
        """One step, forward, backward and Adadelta's update, as a tf.function of no
        arguments returning (loss, gradients)."""
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = self.loss_fn(self.labels, self.model(self.images, training=True))
            gradients = tape.gradient(loss, self.variables)
            self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))
            return loss, gradients
        return step


def build(batch_size: int, precision: str = "float32", seed: int = 0) -> SyntheticTraining:
    """The default recipe's model and optimizer (Adadelta 1.0, its slots built), seeded."""
    tf.keras.utils.set_random_seed(seed)
    model = model_lib.build_model(precision=precision)
    optimizer = model_lib.make_optimizer("adadelta", 1.0)
    optimizer.build(model.trainable_variables)
    return SyntheticTraining(
        model, optimizer, model_lib.make_loss(),
        model.trainable_variables,
        tf.random.uniform([batch_size, *mnist.IMAGE_SHAPE]),
        tf.random.uniform([batch_size], maxval=mnist.NUM_CLASSES, dtype=tf.int64))
