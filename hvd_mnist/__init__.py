"""hvd_mnist: data-parallel TensorFlow 2 training of the Keras MNIST CNN with Horovod."""

# First, before any module imports TensorFlow: tf-keras as tf.keras where it is installed.
from hvd_mnist.worker import keras_compat  # noqa: F401
