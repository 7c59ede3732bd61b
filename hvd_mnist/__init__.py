"""hvd_mnist: data-parallel TensorFlow 2 training of the Keras MNIST CNN with Horovod."""

# First, before any module imports TensorFlow: Keras 2 as tf.keras on TF >= 2.16.
from hvd_mnist import legacy_keras  # noqa: F401
